package scanner

import (
	"fmt"

	"github.com/delayd/delayd/internal/store"
)

// errUnconfirmedClaim marks the envelopes of a claim its wait did not
// confirm, given back unsent and uncounted with redis.wait_claims: strict.
// A failover before a replica has the claim brings back the attempt number
// it took; since nothing went out under it, no attempt repeats.
var errUnconfirmedClaim = fmt.Errorf("claim not confirmed by the replicas redis.wait_replicas asks for, given back unsent (redis.wait_claims: strict): %w", ErrUnreachable)

// claimUnconfirmed warns, at most every failLogEvery, about claimed
// envelopes that go out though no replica confirmed their claim: a
// failover before the replicas have it brings back their previous attempt
// number, and a lost claim delivers them again under the same attempt. A
// timer service that stopped delivering for a missing replica would be
// worse, unless the operator chose that (StrictClaims: the envelopes are
// given back unsent instead). The store counts the short waits.
func (s *Scanner) claimUnconfirmed(res []store.ClaimResult) {
	var why error
	n := 0
	for _, r := range res {
		if r.Unconfirmed && len(r.Items) > 0 {
			n += len(r.Items)
			why = r.Why
		}
	}
	if why == nil {
		return
	}
	ok, n := s.shortLog.Note(n)
	if !ok {
		return
	}
	msg := "claims not confirmed by the Redis replicas redis.wait_replicas asks for: delivering anyway " +
		"(a failover now may repeat these deliveries with the same attempt number)"
	if s.opt.StrictClaims {
		msg = "claims not confirmed by the Redis replicas redis.wait_replicas asks for: given back unsent and uncounted " +
			"(redis.wait_claims: strict); deliveries pause until a replica confirms"
	}
	s.log.Warn(msg, "envelopes", n, "error", why)
}
