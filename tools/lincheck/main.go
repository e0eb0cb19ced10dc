// lincheck: checks a history recorded by `tucana-crashtest campaign` for
// linearizability with Porcupine (github.com/anishathalye/porcupine), one key (or one
// hashtag's keys) at a time, against the sequential model of Redis string keys under
// GET, SET, SET NX, INCR and MULTI/EXEC transactions of GETs and INCRs.
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
// new value. A transaction is {"op": "txn", "key": "{tag}", "txn": [{"op": "get"|"incr",
// "key": str}, ...], "outputs": [str|null, ...]}: its commands applied at one instant,
// each ok output what its command answered; every key of a transaction holds the same
// hashtag, and operations are checked per hashtag (a key without one is its own).
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
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	Client   int       `json:"client"`
	Key      string    `json:"key"`
	Op       string    `json:"op"`
	Value    string    `json:"value"`
	Txn      []command `json:"txn"`
	Status   string    `json:"status"`
	Output   *string   `json:"output"`
	Outputs  []*string `json:"outputs"`
	CallNs   int64     `json:"call_ns"`
	ReturnNs int64     `json:"return_ns"`
}

// command is one command of a transaction.
type command struct {
	Op    string `json:"op"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

type history struct {
	Ops []record `json:"ops"`
}

// input is what a client asked: one command, or (op "txn") a transaction of `txn`.
type input struct {
	key   string
	op    string
	value string
	txn   []command
}

// output is what it got (known false: indeterminate); a transaction's `values` are its
// commands' answers.
type output struct {
	known  bool
	value  *string
	values []*string
}

// state of a partition's keys: a key absent from the map holds nothing. Steps never
// change a state they are given (Porcupine keeps them), they copy it.
type state map[string]string

func (s state) with(key, value string) state {
	next := make(state, len(s)+1)
	for k, v := range s {
		next[k] = v
	}
	next[key] = value
	return next
}

func equal(a, b state) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// apply runs one command on `s`: whether answering `value` (when `known`) is possible,
// and the state after it.
func apply(s state, c command, known bool, value *string) (bool, state) {
	current, present := s[c.Key]
	switch c.Op {
	case "get":
		if !known {
			return true, s
		}
		if value == nil {
			return !present, s
		}
		return present && current == *value, s
	case "set":
		return true, s.with(c.Key, c.Value)
	case "setnx":
		if !known {
			if present {
				return true, s
			}
			return true, s.with(c.Key, c.Value)
		}
		if value != nil && *value == "1" {
			return !present, s.with(c.Key, c.Value)
		}
		return present, s
	case "incr":
		n := int64(0)
		if present {
			v, err := strconv.ParseInt(current, 10, 64)
			if err != nil {
				// INCR of a non-integer is refused: no effect, and it cannot have
				// answered a value.
				return !known, s
			}
			n = v
		}
		next := strconv.FormatInt(n+1, 10)
		if !known {
			return true, s.with(c.Key, next)
		}
		return value != nil && *value == next, s.with(c.Key, next)
	}
	return false, s
}

func step(st interface{}, in interface{}, out interface{}) (bool, interface{}) {
	s := st.(state)
	i := in.(input)
	o := out.(output)
	if i.op != "txn" {
		return apply(s, command{i.op, i.key, i.value}, o.known, o.value)
	}
	for n, c := range i.txn {
		var value *string
		if o.known {
			value = o.values[n]
		}
		ok, next := apply(s, c, o.known, value)
		if !ok {
			return false, st
		}
		s = next
	}
	return true, s
}

func describe(in interface{}, out interface{}) string {
	i := in.(input)
	o := out.(output)
	answer := func(v *string) string {
		if !o.known {
			return "?"
		}
		if v == nil {
			return "nil"
		}
		return strconv.Quote(*v)
	}
	one := func(c command, v *string) string {
		switch c.Op {
		case "get", "incr":
			return fmt.Sprintf("%s(%s) -> %s", c.Op, c.Key, answer(v))
		default:
			return fmt.Sprintf("%s(%s, %q) -> %s", c.Op, c.Key, c.Value, answer(v))
		}
	}
	if i.op != "txn" {
		return one(command{i.op, i.key, i.value}, o.value)
	}
	parts := make([]string, len(i.txn))
	for n, c := range i.txn {
		var v *string
		if o.known {
			v = o.values[n]
		}
		parts[n] = one(c, v)
	}
	return "multi[" + strings.Join(parts, "; ") + "]"
}

// partitionOf is the part of a key Redis Cluster hashes: the first non-empty `{...}`,
// else the whole key. Operations are checked per partition, a transaction's with its
// keys' (they share one).
func partitionOf(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end]
		}
	}
	return key
}

var model = porcupine.Model{
	Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range ops {
			k := partitionOf(op.Input.(input).key)
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
	Equal:             func(a, b interface{}) bool { return equal(a.(state), b.(state)) },
	DescribeOperation: describe,
	DescribeState: func(st interface{}) string {
		s := st.(state)
		keys := make([]string, 0, len(s))
		for k := range s {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for n, k := range keys {
			parts[n] = fmt.Sprintf("%s=%q", k, s[k])
		}
		return "{" + strings.Join(parts, ", ") + "}"
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
// INCR's effects are all observed (as counts), so indeterminate INCRs stay, and so do
// indeterminate transactions that write. The commands of transactions count as the
// operations they are on their keys.
func unobserved(ops []record) []bool {
	type keyInfo struct {
		ops      map[string]bool
		read     map[string]bool
		lastCall int64
		final    int64 // the latest call of an ok get
	}
	keys := map[string]*keyInfo{}
	info := func(key string) *keyInfo {
		k := keys[key]
		if k == nil {
			k = &keyInfo{ops: map[string]bool{}, read: map[string]bool{}, final: -1}
			keys[key] = k
		}
		return k
	}
	for _, r := range ops {
		for n, c := range commandsOf(r) {
			k := info(c.Key)
			k.ops[c.Op] = true
			out := r.Output
			if r.Op == "txn" && n < len(r.Outputs) {
				out = r.Outputs[n]
			}
			if c.Op == "get" && r.Status == "ok" {
				if out != nil {
					k.read[*out] = true
				}
				if r.Op != "txn" && r.CallNs > k.final {
					k.final = r.CallNs
				}
			}
		}
	}
	for _, r := range ops {
		for _, c := range commandsOf(r) {
			k := keys[c.Key]
			if !(r.Op == "get" && r.Status == "ok" && r.CallNs == k.final) && r.CallNs > k.lastCall {
				k.lastCall = r.CallNs
			}
		}
	}
	drop := make([]bool, len(ops))
	for n, r := range ops {
		k := keys[r.Key]
		if r.Op == "txn" || r.Status != "info" || k.read[r.Value] || k.ops["incr"] {
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

// commandsOf is what a record asked: its transaction's commands, or itself.
func commandsOf(r record) []command {
	if r.Op == "txn" {
		return r.Txn
	}
	return []command{{r.Op, r.Key, r.Value}}
}

// checkRecord refuses a record the model cannot take.
func checkRecord(r record) error {
	known := func(op string) bool {
		switch op {
		case "get", "set", "setnx", "incr":
			return true
		}
		return false
	}
	if r.Op != "txn" {
		if !known(r.Op) {
			return fmt.Errorf("unknown op %q", r.Op)
		}
		return nil
	}
	if len(r.Txn) == 0 {
		return fmt.Errorf("a transaction without commands")
	}
	if r.Status == "ok" && len(r.Outputs) != len(r.Txn) {
		return fmt.Errorf("a transaction of %d commands with %d outputs", len(r.Txn), len(r.Outputs))
	}
	for _, c := range r.Txn {
		if !known(c.Op) {
			return fmt.Errorf("unknown op %q in a transaction", c.Op)
		}
		if partitionOf(c.Key) != partitionOf(r.Key) {
			return fmt.Errorf("a transaction on %q with a command on %q (another hashtag)", r.Key, c.Key)
		}
	}
	return nil
}

// writes is whether a record may change a key.
func writes(r record) bool {
	for _, c := range commandsOf(r) {
		if c.Op != "get" {
			return true
		}
	}
	return false
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
		if err := checkRecord(r); err != nil {
			return nil, nil, fmt.Errorf("operation %d: %v", n, err)
		}
		in := input{r.Key, r.Op, r.Value, r.Txn}
		switch r.Status {
		case "fail":
			continue
		case "ok":
			if r.ReturnNs < r.CallNs {
				return nil, nil, fmt.Errorf("operation %d returns before its call", n)
			}
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: r.CallNs,
				Output: output{true, r.Output, r.Outputs}, Return: r.ReturnNs})
		case "info":
			if !writes(r) || drop[n] {
				continue
			}
			// No end: it may take effect after everything else.
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: in, Call: r.CallNs,
				Output: output{false, nil, nil}, Return: end + 1})
		default:
			return nil, nil, fmt.Errorf("operation %d: unknown status %q", n, r.Status)
		}
		for _, c := range commandsOf(r) {
			keys[c.Key] = true
		}
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
					partitionOf(part[0].Input.(input).key), len(part))
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
