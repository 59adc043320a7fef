package api

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkDecodeGrantBody: what reading a grant request's body costs the
// API (the body check and the decode), the most frequent body it reads.
func BenchmarkDecodeGrantBody(b *testing.B) {
	const body = `{"holder":"gw-1","generation":3,"customer":"acme","meter":"tokens","amount":"1","min_amount":"1","ttl":"30s","budgets":["pool:hot","global"]}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest("POST", "/v1/grants", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		var g grantBody
		if err := decodeJSON(r, &g); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckGrantBody(b *testing.B) {
	body := []byte(`{"holder":"gw-1","generation":3,"customer":"acme","meter":"tokens","amount":"1","min_amount":"1","ttl":"30s","budgets":["pool:hot","global"]}`)
	b.ReportAllocs()
	for b.Loop() {
		if err := checkBody(body, &grantBody{}); err != nil {
			b.Fatal(err)
		}
	}
}
