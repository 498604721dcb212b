package envelope

import (
	"hash/fnv"
	"strconv"
	"time"
)

// JitterOffset is how long after its unjittered time occurrence k (from 1;
// a one-shot's is 1) of the envelope id is due under a jitter d: a whole
// number of ms in [0, d), uniform over ids. It is derived from the id, not
// drawn, so every daemon, and a resend of the request, computes the same.
func JitterOffset(id string, k int64, d time.Duration) time.Duration {
	ms := d.Milliseconds()
	if ms <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte("/" + strconv.FormatInt(k, 10)))
	return time.Duration(h.Sum64()%uint64(ms)) * time.Millisecond
}
