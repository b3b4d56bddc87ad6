package lease

import (
	"errors"
	"fmt"
)

// Kind is what a refusal of the core means to the caller (the server
// answers each with its HTTP status).
type Kind int

// The kinds of refusal.
const (
	// Invalid: the request contradicts itself or the configuration (400).
	Invalid Kind = iota + 1
	// Forbidden: the caller may not, and waiting does not help (403).
	Forbidden
	// NotFound: no such project, lease, job or node (404).
	NotFound
	// Conflict: not in the present state of the thing (409).
	Conflict
	// Busy: a limit that passes with time (429).
	Busy
)

// Error is a refusal of the core, with its kind.
type Error struct {
	Kind Kind
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf makes a refusal of kind k.
func Errorf(k Kind, format string, args ...any) error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}

// KindOf is the kind of err's refusal, 0 when it is none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}
