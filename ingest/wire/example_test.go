package wire_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/shopspring/decimal"

	"github.com/tally-ledger/tally/amount"
	"github.com/tally-ledger/tally/ingest/wire"
)

func ExampleDecode() {
	key := []byte("acme")
	value := []byte(`{
	  "schema": "meter.batch.v1",
	  "batch_id": "01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10",
	  "producer": "gateway-eu-1",
	  "epoch": 3,
	  "sent_at": "2026-12-02T10:00:00.120Z",
	  "records": [
	    {"operation_id": "01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11", "customer": "acme", "meter": "api_calls",
	     "seq": 1042, "total": "1234567", "quantity": "3", "occurred_at": "2026-12-02T09:59:58Z"},
	    {"operation_id": "01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a12", "customer": "acme", "meter": "api_calls",
	     "seq": 1043, "total": "1e5", "occurred_at": "2026-12-02T09:59:59Z"},
	    {"operation_id": "01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a13", "customer": "acme", "meter": "api_calls",
	     "seq": 1044, "total": "1234571.5", "occurred_at": "2026-12-02T11:00:00+01:00", "final": true}
	  ]
	}`)
	b, index, rejected, err := wire.Decode(key, value)
	if err != nil {
		fmt.Println("dead letter:", err)
		return
	}
	for i, r := range b.Records {
		fmt.Printf("records[%d]: %s/%s seq %d total %s at %s final=%v\n",
			index[i], r.Customer, r.Meter, r.Seq, r.Total, r.OccurredAt.Format(time.RFC3339), r.Final)
	}
	for _, re := range rejected {
		fmt.Printf("dead letter %s: %v\n", re.Err.Reason, re.Err)
	}
	// Output:
	// records[0]: acme/api_calls seq 1042 total 1234567 at 2026-12-02T09:59:58Z final=false
	// records[2]: acme/api_calls seq 1044 total 1234571.5 at 2026-12-02T10:00:00Z final=true
	// dead letter bad_decimal: records[1].total: "1e5" is not a decimal number (bad_decimal)
}

func ExampleDecode_messageError() {
	_, _, _, err := wire.Decode([]byte("acme"), []byte(`{"schema": "meter.batch.v2", "records": []}`))
	var e *wire.Error
	if errors.As(err, &e) {
		fmt.Println(e.Reason)
		fmt.Println(err)
	}
	// Output:
	// unknown_schema
	// schema: "meter.batch.v2" is not a schema this decoder reads; want "meter.batch.v1" (unknown_schema)
}

func ExampleEncode() {
	b := wire.Batch{
		Schema:   wire.Schema,
		BatchID:  uuid.MustParse("01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10"),
		Producer: "gateway-eu-1",
		Epoch:    3,
		SentAt:   time.Date(2026, 12, 2, 10, 0, 0, 120e6, time.UTC),
		Records: []wire.Record{{
			OperationID: uuid.MustParse("01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11"),
			Customer:    "acme",
			Meter:       "api_calls",
			Seq:         1042,
			Total:       amount.MustParse("1234567"),
			Quantity:    decimal.NewNullDecimal(amount.MustParse("3")),
			OccurredAt:  time.Date(2026, 12, 2, 9, 59, 58, 0, time.UTC),
		}},
	}
	value, err := wire.Encode(b)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(value))

	b.Records[0].Customer = "ácme"
	_, err = wire.Encode(b)
	fmt.Println(err)
	// Output:
	// {"schema":"meter.batch.v1","batch_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a10","producer":"gateway-eu-1","epoch":3,"sent_at":"2026-12-02T10:00:00.12Z","records":[{"operation_id":"01938f2e-6c1b-7d4e-9a51-3c2f9b7e4a11","customer":"acme","meter":"api_calls","seq":1042,"total":"1234567","quantity":"3","occurred_at":"2026-12-02T09:59:58Z"}]}
	// records[0].customer: "ácme" has 'á' at byte 0; ids use only A-Z a-z 0-9 . _ : - (bad_id)
}
