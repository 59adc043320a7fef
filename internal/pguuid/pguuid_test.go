package pguuid_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/tally-ledger/tally/internal/pguuid"
)

// The native form encodes to the same bytes as the driver.Valuer path.
func TestSliceEncodesAsTheValuerDoes(t *testing.T) {
	m := pgtype.NewMap()
	ids := []uuid.UUID{uuid.New(), uuid.New()}
	want, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, pguuid.Slice(ids), nil)
	if err != nil || string(got) != string(want) {
		t.Fatalf("native encoding %x (%v), valuer %x", got, err, want)
	}
	null, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, pguuid.NullSlice([]*uuid.UUID{&ids[0], nil}), nil)
	if err != nil || len(null) == 0 {
		t.Fatalf("with a NULL: %x %v", null, err)
	}
}

func BenchmarkEncodeFive(b *testing.B) {
	m := pgtype.NewMap()
	ids := make([]uuid.UUID, 5)
	for i := range ids {
		ids[i] = uuid.New()
	}
	b.Run("valuer", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("native", func(b *testing.B) {
		for b.Loop() {
			if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, pguuid.Slice(ids), nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
