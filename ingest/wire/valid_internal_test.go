package wire

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// validCases are JSON texts at the edges of the grammar, valid and not.
var validCases = []string{
	``, ` `, `{}`, `[]`, ` {} `, "\t[\r\n]\n", `{`, `}`, `[`, `]`, `{]`, `[}`, `[[]`, `[]]`, `{}{}`, `{} x`, `[] []`,
	`null`, `nul`, `nulll`, `true`, `tru`, `false`, `fals`, `True`, `NaN`, `Infinity`,
	`0`, `-0`, `00`, `01`, `-`, `-a`, `1.`, `1.5`, `.5`, `1e5`, `1E+5`, `1e-5`, `1e`, `1e+`, `1.5e3`, `-1.0e-0`, `+1`,
	`0x10`, `1 2`, `123456789012345678901234567890`,
	`""`, `"`, `"abc`, `"a\"b"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\a"`, `"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00e"`,
	`"\ud800"`, "\"\x01\"", "\"\x1f\"", "\"\x7f\"", "\"\xff\xfe\"", "\"tab\there\"", `"\`, `"\u`,
	`{"a":1}`, `{"a" : 1 , "b" : [1, 2, {"c": null}]}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,"a":1}`, `{a:1}`, `{"a":1 "b":2}`,
	`{"a":1,"a":2}`, `{1:2}`, `[1,]`, `[,1]`, `[1 2]`, `[1,,2]`, `[-]`, `["a",["b",{"c":[]}]]`, `{"a":[}`, `{"a":{]}`,
	`{"records":[{"seq":1},{"seq":2}]}`, "\ufeff{}",
}

// TestValidAgreesWithEncodingJSON compares valid with encoding/json.Valid
// on the edge cases, on every sample message, on every prefix of a small
// one, and on every sample with each byte in turn replaced by a byte that
// matters to the grammar.
func TestValidAgreesWithEncodingJSON(t *testing.T) {
	check := func(what string, d []byte) {
		t.Helper()
		if got, want := valid(d), json.Valid(d); got != want {
			t.Fatalf("%s: valid %v, encoding/json %v: %q", what, got, want, clip(d))
		}
	}
	for _, c := range validCases {
		check("case", []byte(c))
	}
	for _, depth := range []int{maxNesting - 1, maxNesting, maxNesting + 1} {
		check("nested arrays", []byte(strings.Repeat("[", depth)+strings.Repeat("]", depth)))
		check("nested objects", []byte(strings.Repeat(`{"a":`, depth)+"1"+strings.Repeat("}", depth)))
	}
	files, err := filepath.Glob("../../testdata/batches/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no sample messages: %v", err)
	}
	corpus, _ := filepath.Glob("testdata/fuzz/FuzzDecode/*")
	var smallest []byte
	for _, name := range append(files, corpus...) {
		d, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		check(name, d)
		if len(d) > 4<<10 {
			continue
		}
		if smallest == nil || len(d) < len(smallest) {
			smallest = d
		}
		m := make([]byte, len(d))
		for i := range d {
			for _, b := range []byte(`{}[]",:\ 0-.e1tnu`) {
				copy(m, d)
				m[i] = b
				check(name+" mutated", m)
			}
		}
	}
	for i := range smallest {
		check("prefix", smallest[:i])
	}
}

// FuzzValid checks valid against encoding/json.Valid on any input.
func FuzzValid(f *testing.F) {
	for _, c := range validCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, d []byte) {
		if got, want := valid(d), json.Valid(d); got != want {
			t.Fatalf("valid %v, encoding/json %v: %q", got, want, d)
		}
	})
}

func BenchmarkValid(b *testing.B) {
	// A message of 1,000 records, like the ingest benchmark's.
	var sb strings.Builder
	sb.WriteString(`{"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"gw-1","epoch":1,` +
		`"sent_at":"2026-12-02T10:00:00Z","records":[`)
	for i := range 1000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"operation_id":"01938f2e-6c1b-7d4e-9a51-%012d","customer":"cust-001","meter":"api_calls",`+
			`"seq":%d,"total":"%d","quantity":"1","occurred_at":"2026-12-02T10:00:00.123456Z"}`, i, i+1, i+1)
	}
	sb.WriteString(`]}`)
	d := []byte(sb.String())
	b.SetBytes(int64(len(d)))
	for _, impl := range []struct {
		name string
		f    func([]byte) bool
	}{{"own", valid}, {"encoding-json", json.Valid}} {
		b.Run(impl.name, func(b *testing.B) {
			for b.Loop() {
				if !impl.f(d) {
					b.Fatal("invalid")
				}
			}
		})
	}
}

func clip(d []byte) []byte {
	if len(d) > 200 {
		return d[:200]
	}
	return d
}

// TestSkipPlainIsExact compares skipPlain, which skips plain string bytes
// eight at a time, with a scan of one byte at a time, from every offset of
// texts of every length up to 40 made of the bytes that matter (a quote, a
// backslash, control characters, the bytes just above them, high bytes)
// and letters.
func TestSkipPlainIsExact(t *testing.T) {
	special := []byte{'"', '\\', 0x00, 0x01, 0x1f, 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 40; n++ {
		for range 1000 {
			d := make([]byte, n)
			for i := range d {
				if rng.IntN(4) == 0 {
					d[i] = special[rng.IntN(len(special))]
				} else {
					d[i] = 'a' + byte(rng.IntN(26))
				}
			}
			for i := range n + 1 {
				want := i
				for want < n && plainStringByte[d[want]] {
					want++
				}
				if got := skipPlain(d, i); got != want {
					t.Fatalf("skipPlain(%q, %d) = %d, one byte at a time %d", d, i, got, want)
				}
			}
		}
	}
}
