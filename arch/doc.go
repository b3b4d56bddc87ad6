// Package arch holds kiln's architecture as tests: the layering rules
// (which packages may import what, each rule with its reason) checked
// against the module's real import graph, and the package table of
// docs/architecture.md checked against the packages that exist and the
// order their imports allow. It has no code of its own to link: the rules
// live in rules_test.go, one line each.
package arch
