package client

import (
	"errors"
	"fmt"
)

// Sentinel errors for what a caller branches on. A *ServiceError from the
// daemon matches the one for its code with errors.Is; errors found before
// sending wrap ErrBadRequest.
var (
	// ErrBadRequest (400): a missing or malformed option or header. Never
	// stored; do not retry unchanged.
	ErrBadRequest = errors.New("bad request")
	// ErrForbidden (403): the target is refused by the daemon's target
	// policy (e.g. $SYS.>, _INBOX.>, the daemon's own prefix). Never stored.
	ErrForbidden = errors.New("forbidden")
	// ErrNotFound (404): no envelope with that id (Get).
	ErrNotFound = errors.New("not found")
	// ErrTooLarge (413): payload or headers over the daemon's limits, or a
	// delivery that would exceed the NATS server's max_payload. Never stored.
	ErrTooLarge = errors.New("too large")
	// ErrUnavailable (503): nothing was written (Redis is down), or no
	// delayd answers at all (no responders), or no stream captures the
	// intake subject. Retrying is safe.
	ErrUnavailable = errors.New("unavailable")
	// ErrOutcomeUnknown (504, or no reply before the context ended): the
	// request may or may not have taken effect. Retry with the same id
	// (ServiceError.ID): the same id replaces, it never duplicates.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// codes maps the daemon's reply codes to the sentinels.
var codes = map[int]error{
	400: ErrBadRequest,
	403: ErrForbidden,
	404: ErrNotFound,
	413: ErrTooLarge,
	503: ErrUnavailable,
	504: ErrOutcomeUnknown,
}

// ServiceError is an error answer from delayd.
type ServiceError struct {
	// Code is the Nats-Service-Error-Code: 400, 403, 404, 413, 503, 504.
	Code int
	// Message is the daemon's Nats-Service-Error: what was wrong and why.
	Message string
	// ID is the envelope id a 504 carries: retry with it (option ID).
	ID string
}

func (e *ServiceError) Error() string { return fmt.Sprintf("%s (code %d)", e.Message, e.Code) }

// Is reports whether target is the sentinel error of e's code.
func (e *ServiceError) Is(target error) bool {
	s, ok := codes[e.Code]
	return ok && s == target
}

// badRequest is an error found before sending: nothing was sent.
func badRequest(verb, format string, args ...any) error {
	return fmt.Errorf("delayd %s: %s (%w)", verb, fmt.Sprintf(format, args...), ErrBadRequest)
}
