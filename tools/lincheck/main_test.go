// The checker's wiring can fail: deliberately non-linearizable tiny histories are
// reported illegal (a read of an overwritten value, an acknowledged INCR lost), and a
// history with a refused and an indeterminate write that may have landed is accepted.
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
