package api

import _ "embed"

// OpenAPI is the description of the API (OpenAPI), checked against the
// server's routes by a test.
//
//go:embed openapi.yaml
var OpenAPI []byte
