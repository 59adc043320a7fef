package producer_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/tally-ledger/tally/producer"
)

// stateWithRecords leaves in dir the state of a producer that recorded n
// records it could not send, and returns its epoch.
func stateWithRecords(t *testing.T, dir string, n int) int64 {
	t.Helper()
	p, err := producer.New(producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir, RetryMin: time.Second, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := p.Record(context.Background(), "acme", "m", d("1"), time.Now()); err != nil {
			t.Fatal(i, err)
		}
	}
	stopNow, cancel := context.WithCancel(context.Background())
	cancel()
	_ = p.Stop(stopNow)
	return p.Epoch()
}

// A state file that cannot be opened for a reason that is not its content
// (here: the process is out of file descriptors, as root cannot be denied a
// permission) is left where it is: New fails, and once the cause is gone
// the same epoch continues with every acknowledged record still buffered.
func TestATemporaryErrorOpeningTheStateKeepsIt(t *testing.T) {
	dir := t.TempDir()
	epoch := stateWithRecords(t, dir, 3)

	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	lowest := f.Fd() // the lowest free descriptor: the next open would get it
	f.Close()
	low := lim
	low.Cur = uint64(lowest)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	p, err := producer.New(producer.Config{Writer: refuseAll{}, Producer: "gw-1", Dir: dir})
	if rerr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		p.Stop(context.Background())
		t.Fatal("New succeeded with no file descriptor left")
	}
	t.Logf("New with no descriptor left: %v", err)
	if moved, _ := filepath.Glob(filepath.Join(dir, "producer.db.unreadable-*")); len(moved) != 0 {
		t.Errorf("the state file was moved aside on %v: %v", err, moved)
	}

	p = newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
	if p.Epoch() != epoch || p.Buffered() != 3 {
		t.Errorf("after the error: epoch %d with %d buffered; want epoch %d with the 3 acknowledged records", p.Epoch(), p.Buffered(), epoch)
	}
}

// damage overwrites pages of the bbolt file at path with bytes no page
// holds; with keepFreelist, the freelist page is spared (so the damage is
// in data pages only).
func damage(t *testing.T, path string, keepFreelist bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The meta page (bbolt's layout, little endian): a 16-byte page
	// header, then magic, version, page size (u32 at 24), flags, the root
	// bucket (16 bytes), the freelist page id (u64 at 48), the high water
	// mark (u64 at 56) and the transaction id (u64 at 64). The meta with
	// the higher transaction id is current.
	pageSize := int(binary.LittleEndian.Uint32(b[24:]))
	meta := b[:pageSize]
	if binary.LittleEndian.Uint64(b[pageSize+64:]) > binary.LittleEndian.Uint64(b[64:]) {
		meta = b[pageSize : 2*pageSize]
	}
	freelist := int(binary.LittleEndian.Uint64(meta[48:]))
	hw := int(binary.LittleEndian.Uint64(meta[56:]))
	damaged := 0
	for pg := 2; pg < hw && (pg+1)*pageSize <= len(b); pg++ {
		if keepFreelist && pg == freelist {
			continue
		}
		for i := pg * pageSize; i < (pg+1)*pageSize; i++ {
			b[i] = 0xa7
		}
		damaged++
	}
	if damaged == 0 {
		t.Fatal("no page to damage")
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A damaged page (freelist or data) makes the state unreadable, like a
// damaged meta page: New moves it aside and starts a new epoch instead of
// panicking (and crash-looping the service that embeds the producer).
func TestADamagedPageIsUnreadableNotAPanic(t *testing.T) {
	for _, tc := range []struct {
		name         string
		keepFreelist bool
	}{{"freelist and data pages", false}, {"data pages", true}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			epoch := stateWithRecords(t, dir, 300)
			path := filepath.Join(dir, "producer.db")
			damage(t, path, tc.keepFreelist)

			p := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
			if p.Epoch() <= epoch {
				t.Errorf("epoch %d after the damage, want a new one above %d", p.Epoch(), epoch)
			}
			if moved, _ := filepath.Glob(path + ".unreadable-*"); len(moved) != 1 {
				t.Errorf("damaged state not kept aside: %v", moved)
			}
			if err := p.Record(context.Background(), "acme", "m", d("1"), time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A state file cut short (as a filesystem crash can leave it: its meta
// pages intact, the pages they point to past its end) is unreadable like a
// damaged one: New moves it aside and starts a new epoch. Reading a page
// past the end of a mapped file is a SIGBUS, which no recover catches: the
// service embedding the producer died at every start.
func TestATruncatedStateFileIsUnreadableNotACrash(t *testing.T) {
	for _, tc := range []struct {
		name string
		keep func(hw, freelist int) int // pages kept of the hw in use
	}{
		{"its last page lost", func(hw, _ int) int { return hw - 1 }},
		{"half of it lost", func(hw, _ int) int { return max(hw/2, 2) }},
		// bolt.Open reads the freelist page: cut off, it was a SIGBUS there.
		{"its freelist page lost", func(_, freelist int) int { return max(freelist, 2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			epoch := stateWithRecords(t, dir, 300)
			path := filepath.Join(dir, "producer.db")
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			pageSize := int(binary.LittleEndian.Uint32(b[24:]))
			meta := b[:pageSize]
			if binary.LittleEndian.Uint64(b[pageSize+64:]) > binary.LittleEndian.Uint64(b[64:]) {
				meta = b[pageSize : 2*pageSize]
			}
			hw, freelist := int(binary.LittleEndian.Uint64(meta[56:])), int(binary.LittleEndian.Uint64(meta[48:]))
			if err := os.Truncate(path, int64(pageSize*tc.keep(hw, freelist))); err != nil {
				t.Fatal(err)
			}
			p := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
			if p.Epoch() <= epoch {
				t.Errorf("epoch %d after the truncation, want a new one above %d", p.Epoch(), epoch)
			}
			if moved, _ := filepath.Glob(path + ".unreadable-*"); len(moved) != 1 {
				t.Errorf("truncated state not kept aside: %v", moved)
			}
			if err := p.Record(context.Background(), "acme", "m", d("1"), time.Now()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A Dir whose parents do not exist yet is created, parents included (each
// new directory's entry synced in its parent), and reopened as it was.
func TestANewNestedDirIsCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "state")
	p := newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing to send: stop at once
	if err := p.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf("state dir: %v %v", fi, err)
	}
	p = newProducer(t, producer.Config{Writer: refuseAll{}, Dir: dir})
	_ = p.Stop(ctx)
}
