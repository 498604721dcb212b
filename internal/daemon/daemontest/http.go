package daemontest

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
)

// HTTPGet gets url and returns the status code and body, failing the test
// when the request fails.
func HTTPGet(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Metric returns the sum of every sample of a metric family in a
// Prometheus exposition, and whether it had any.
func Metric(body, name string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.e+-]+)$`)
	ms := re.FindAllStringSubmatch(body, -1)
	sum := 0.0
	for _, m := range ms {
		v, _ := strconv.ParseFloat(m[2], 64)
		sum += v
	}
	return sum, len(ms) > 0
}
