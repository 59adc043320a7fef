package api

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// grantBodyJSON is a grant request's body, the most frequent body the API
// reads.
const grantBodyJSON = `{"holder":"gw-1","generation":3,"customer":"acme","meter":"tokens","amount":"1","min_amount":"1","ttl":"30s","budgets":["pool:hot","global"]}`

// BenchmarkDecodeGrantBody: what reading a grant request's body costs the
// API, the body check and the decode together.
func BenchmarkDecodeGrantBody(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest("POST", "/v1/grants", strings.NewReader(grantBodyJSON))
		r.Header.Set("Content-Type", "application/json")
		var g grantBody
		if err := decodeJSON(r, &g); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckGrantBody: the body check alone.
func BenchmarkCheckGrantBody(b *testing.B) {
	body := []byte(grantBodyJSON)
	b.ReportAllocs()
	for b.Loop() {
		if err := checkBody(body, &grantBody{}); err != nil {
			b.Fatal(err)
		}
	}
}
