package scanner

import (
	"time"

	"github.com/delayd/delayd/internal/store"
)

// shortClaims rate-limits the warning about claims whose wait for
// replicas fell short (redis.wait_replicas). Only the Run loop touches it.
type shortClaims struct {
	last time.Time
	n    int // envelopes published unconfirmed since the last warning
}

// claimUnconfirmed warns, at most every failLogEvery, about claimed
// envelopes that go out though no replica confirmed their claim: a
// failover before the replicas have it brings back their previous attempt
// number, and a lost claim delivers them again under the same attempt. A
// timer service that stopped delivering for a missing replica would be
// worse; the store counts the short waits.
func (s *Scanner) claimUnconfirmed(res []store.ClaimResult) {
	var why error
	for _, r := range res {
		if r.Unconfirmed && len(r.Items) > 0 {
			s.short.n += len(r.Items)
			why = r.Why
		}
	}
	if why == nil {
		return
	}
	if now := s.opt.Now(); now.Sub(s.short.last) >= failLogEvery {
		s.log.Warn("claims not confirmed by the Redis replicas redis.wait_replicas asks for: delivering anyway "+
			"(a failover now may repeat these deliveries with the same attempt number)", "envelopes", s.short.n, "error", why)
		s.short.last, s.short.n = now, 0
	}
}
