// Package openapitest holds a client generated from kiln's API description
// (api/openapi.yaml) by a standard generator, oapi-codegen, and the tests
// that run it against a real server: the description must be one that
// real tools accept, and true to the server.
//
// The generated code is committed; regenerate it after changing the
// description (a test, and scripts/openapi.sh, fail while it is stale):
//
//	go generate ./api/openapitest
package openapitest

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config oapi-codegen.yaml -o client.gen.go ../openapi.yaml
