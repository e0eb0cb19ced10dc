// lincheck: checks a history recorded by `tucana-crashtest campaign` for
// linearizability with Porcupine (github.com/anishathalye/porcupine), one key at a
// time, against the sequential model of one Redis string key under GET, SET, SET NX
// and INCR.
//
// Usage: lincheck [-timeout-s N] [-html PATH] HISTORY.json
//
// The history is a JSON object {"ops": [...]}, one entry per operation a client
// invoked: {"client": int, "key": str, "op": "get"|"set"|"setnx"|"incr",
// "value": str (set, setnx), "status": "ok"|"fail"|"info", "output": str|null,
// "call_ns": int, "return_ns": int}. "fail" means the server refused it (it took no
// effect) and drops the operation; "info" means indeterminate (a timeout, a dropped
// connection): it may take effect at any moment after its call, so it is given no end,
// as Jepsen models it; an indeterminate get observed nothing and is dropped. For an
// ok get, "output" is the value (null: no key); for setnx "1" or "0"; for incr the
// new value.
//
// Indeterminate writes no read observed are dropped too (see unobserved), which keeps
// the search from trying every subset of them: each one kept doubles it.
//
// Prints one line, `lincheck: ok|illegal|unknown, N operations, K keys`, and exits 0
// (linearizable), 1 (a violation: the visualisation is written to -html if given), 3
// (the search timed out: undecided) or 2 (bad input). Owns nothing but its process.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	Client   int     `json:"client"`
	Key      string  `json:"key"`
	Op       string  `json:"op"`
	Value    string  `json:"value"`
	Status   string  `json:"status"`
	Output   *string `json:"output"`
	CallNs   int64   `json:"call_ns"`
	ReturnNs int64   `json:"return_ns"`
}

type history struct {
	Ops []record `json:"ops"`
}

// input is what a client asked; output what it got (known false: indeterminate).
type input struct {
	key   string
	op    string
	value string
}

type output struct {
	known bool
	value *string
}

// state of one key: absent, or a string.
type state struct {
	present bool
	value   string
}

func step(st interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	o := out.(output)
	switch i.op {
	case "get":
		if !o.known {
			return true, s
		}
		if o.value == nil {
			return !s.present, s
		}
		return s.present && s.value == *o.value, s
	case "set":
		return true, state{true, i.value}
	case "setnx":
		if !o.known {
			if s.present {
				return true, s
			}
			return true, state{true, i.value}
		}
		if o.value != nil && *o.value == "1" {
			return !s.present, state{true, i.value}
		}
		return s.present, s
	case "incr":
		n := int64(0)
		if s.present {
			v, err := strconv.ParseInt(s.value, 10, 64)
			if err != nil {
				// INCR of a non-integer is refused: no effect, and it cannot have
				// answered a value.
				return !o.known, s
			}
			n = v
		}
		next := state{true, strconv.FormatInt(n+1, 10)}
		if !o.known {
			return true, next
		}
		return o.value != nil && *o.value == next.value, next
	}
	return false, s
}

func describe(in interface{}, out interface{}) string {
	i := in.(input)
	o := out.(output)
	res := "?"
	if o.known {
		res = "nil"
		if o.value != nil {
			res = strconv.Quote(*o.value)
		}
	}
	switch i.op {
	case "get":
		return fmt.Sprintf("get(%s) -> %s", i.key, res)
	case "incr":
		return fmt.Sprintf("incr(%s) -> %s", i.key, res)
	default:
		return fmt.Sprintf("%s(%s, %q) -> %s", i.op, i.key, i.value, res)
	}
}

var model = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range ops {
			k := op.Input.(input).key
			if _, seen := byKey[k]; !seen {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:              func() interface{} { return state{} },
	Step:              step,
	Equal:             func(a, b interface{}) bool { return a.(state) == b.(state) },
	DescribeOperation: describe,
	DescribeState: func(st interface{}) string {
		s := st.(state)
		if !s.present {
			return "nil"
		}
		return strconv.Quote(s.value)
	},
}

// unobserved reports, per record, whether it is an indeterminate write that can be
// dropped without changing the verdict, given that values written are unique per key:
//
//   - an indeterminate SET of a key that only GET and SET touch, whose value no ok GET
//     returned: if it took effect, no read saw it before the next write replaced it, so
//     a linearization with it stays one without it, and one without it gains it at the
//     end;
//   - an indeterminate SET NX of a key that only GET and SET NX touch and that has an ok
//     GET called after every other operation on it began (a final read), whose value no
//     ok GET returned: a SET NX that took effect would hold the key for good, and the
//     final read would return it; so it took no effect.
//
// INCR's effects are all observed (as counts), so indeterminate INCRs stay.
func unobserved(ops []record) []bool {
	type keyInfo struct {
		ops      map[string]bool
		read     map[string]bool
		lastCall int64
		final    int64 // the latest call of an ok get
	}
	keys := map[string]*keyInfo{}
	for _, r := range ops {
		k := keys[r.Key]
		if k == nil {
			k = &keyInfo{ops: map[string]bool{}, read: map[string]bool{}, final: -1}
			keys[r.Key] = k
		}
		k.ops[r.Op] = true
		if r.Op == "get" && r.Status == "ok" {
			if r.Output != nil {
				k.read[*r.Output] = true
			}
			if r.CallNs > k.final {
				k.final = r.CallNs
			}
		}
	}
	for _, r := range ops {
		k := keys[r.Key]
		if !(r.Op == "get" && r.Status == "ok" && r.CallNs == k.final) && r.CallNs > k.lastCall {
			k.lastCall = r.CallNs
		}
	}
	drop := make([]bool, len(ops))
	for n, r := range ops {
		k := keys[r.Key]
		if r.Status != "info" || k.read[r.Value] || k.ops["incr"] {
			continue
		}
		switch r.Op {
		case "set":
			drop[n] = !k.ops["setnx"]
		case "setnx":
			drop[n] = !k.ops["set"] && k.final >= k.lastCall
		}
	}
	return drop
}

// operations turns records into Porcupine's operations: refused ones dropped,
// indeterminate ones without an end, unobserved indeterminate writes dropped.
func operations(h history) ([]porcupine.Operation, map[string]bool, error) {
	drop := unobserved(h.Ops)
	var end int64
	for _, r := range h.Ops {
		if r.ReturnNs > end {
			end = r.ReturnNs
		}
		if r.CallNs > end {
			end = r.CallNs
		}
	}
	keys := map[string]bool{}
	var ops []porcupine.Operation
	for n, r := range h.Ops {
		switch r.Op {
		case "get", "set", "setnx", "incr":
		default:
			return nil, nil, fmt.Errorf("operation %d: unknown op %q", n, r.Op)
		}
		in := input{r.Key, r.Op, r.Value}
		switch r.Status {
		case "fail":
			continue
		case "ok":
			if r.ReturnNs < r.CallNs {
				return nil, nil, fmt.Errorf("operation %d returns before its call", n)
			}
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: r.CallNs,
				Output: output{true, r.Output}, Return: r.ReturnNs})
		case "info":
			if r.Op == "get" || drop[n] {
				continue
			}
			// No end: it may take effect after everything else.
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: r.CallNs,
				Output: output{false, nil}, Return: end + 1})
		default:
			return nil, nil, fmt.Errorf("operation %d: unknown status %q", n, r.Status)
		}
		keys[r.Key] = true
	}
	return ops, keys, nil
}

func main() {
	timeoutS := flag.Int("timeout-s", 60, "give up the search after this many seconds (exit 3)")
	html := flag.String("html", "", "where to write Porcupine's visualisation of a violation")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: lincheck [-timeout-s N] [-html PATH] HISTORY.json")
		os.Exit(2)
	}
	data, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "lincheck:", err)
		os.Exit(2)
	}
	var h history
	if err := json.Unmarshal(data, &h); err != nil {
		fmt.Fprintln(os.Stderr, "lincheck: bad history:", err)
		os.Exit(2)
	}
	ops, keys, err := operations(h)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lincheck: bad history:", err)
		os.Exit(2)
	}
	result, info := porcupine.CheckOperationsVerbose(model, ops, time.Duration(*timeoutS)*time.Second)
	fmt.Printf("lincheck: %s, %d operations, %d keys\n", map[porcupine.CheckResult]string{
		porcupine.Ok: "ok", porcupine.Illegal: "illegal", porcupine.Unknown: "unknown"}[result],
		len(ops), len(keys))
	switch result {
	case porcupine.Ok:
		os.Exit(0)
	case porcupine.Illegal:
		for _, part := range model.Partition(ops) {
			r := porcupine.CheckOperationsTimeout(model, part, 10*time.Second)
			if r == porcupine.Illegal {
				fmt.Printf("lincheck: key %s is not linearizable (%d operations)\n",
					part[0].Input.(input).key, len(part))
			}
		}
		if *html != "" {
			if err := porcupine.VisualizePath(model, info, *html); err != nil {
				fmt.Fprintln(os.Stderr, "lincheck: writing the visualisation:", err)
			} else {
				fmt.Printf("lincheck: visualisation in %s\n", *html)
			}
		}
		os.Exit(1)
	default:
		os.Exit(3)
	}
}
