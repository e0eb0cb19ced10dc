// The checker's wiring can fail: deliberately non-linearizable tiny histories are
// reported illegal (a read of an overwritten value, an acknowledged INCR lost, and the
// dirty read the first netns campaign found: seed 2 read a write that timed out and was
// lost in the failover, then the older value again, and a transaction's reads seeing
// half of another transaction), and histories with refused and indeterminate writes
// (and transactions) that may have landed are accepted; dropping unobserved
// indeterminate writes keeps what is observed.
package main

import (
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

func check(t *testing.T, path string) porcupine.CheckResult {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var h history
	if err := json.Unmarshal(data, &h); err != nil {
		t.Fatal(err)
	}
	ops, _, err := operations(h)
	if err != nil {
		t.Fatal(err)
	}
	return porcupine.CheckOperationsTimeout(model, ops, 10*time.Second)
}

func TestAStaleReadIsIllegal(t *testing.T) {
	if got := check(t, "testdata/stale-read.json"); got != porcupine.Illegal {
		t.Fatalf("stale read: %s, want Illegal", got)
	}
}

func TestALostIncrIsIllegal(t *testing.T) {
	if got := check(t, "testdata/lost-incr.json"); got != porcupine.Illegal {
		t.Fatalf("lost incr: %s, want Illegal", got)
	}
}

func TestIndeterminateAndRefusedOpsAreModelled(t *testing.T) {
	if got := check(t, "testdata/linearizable.json"); got != porcupine.Ok {
		t.Fatalf("linearizable history: %s, want Ok", got)
	}
}

func TestTheCampaignsDirtyReadIsIllegal(t *testing.T) {
	if got := check(t, "testdata/dirty-read-campaign-seed2.json"); got != porcupine.Illegal {
		t.Fatalf("dirty read: %s, want Illegal", got)
	}
}

func TestATornTransactionIsIllegal(t *testing.T) {
	if got := check(t, "testdata/torn-txn.json"); got != porcupine.Illegal {
		t.Fatalf("torn transaction: %s, want Illegal", got)
	}
}

func TestTransactionsApplyAtOneInstant(t *testing.T) {
	if got := check(t, "testdata/txn-linearizable.json"); got != porcupine.Ok {
		t.Fatalf("transactions: %s, want Ok", got)
	}
}

func TestATransactionOverTwoHashtagsIsRefused(t *testing.T) {
	h := history{Ops: []record{{Key: "{a}", Op: "txn", Status: "info",
		Txn: []command{{Op: "incr", Key: "{a}x"}, {Op: "incr", Key: "{b}x"}}}}}
	if _, _, err := operations(h); err == nil {
		t.Fatal("a transaction over two hashtags was accepted")
	}
}

func TestOnlyUnobservedIndeterminateWritesAreDropped(t *testing.T) {
	s := func(v string) *string { return &v }
	ops := []record{
		{Key: "r", Op: "set", Value: "a", Status: "info", CallNs: 0},
		{Key: "r", Op: "set", Value: "b", Status: "info", CallNs: 1},
		{Key: "r", Op: "get", Status: "ok", Output: s("b"), CallNs: 2, ReturnNs: 3},
		{Key: "x", Op: "setnx", Value: "a", Status: "info", CallNs: 0},
		{Key: "x", Op: "setnx", Value: "b", Status: "ok", Output: s("0"), CallNs: 1, ReturnNs: 2},
		// No final read of y: its indeterminate SET NX may hold it unseen.
		{Key: "y", Op: "setnx", Value: "a", Status: "info", CallNs: 0},
		{Key: "y", Op: "setnx", Value: "b", Status: "ok", Output: s("0"), CallNs: 1, ReturnNs: 2},
		{Key: "x", Op: "get", Status: "ok", Output: nil, CallNs: 5, ReturnNs: 6},
	}
	got := unobserved(ops)
	want := []bool{true, false, false, true, false, false, false, false}
	for n := range want {
		if got[n] != want[n] {
			t.Errorf("op %d: dropped %v, want %v", n, got[n], want[n])
		}
	}
}
