// shardcheck-porcupine: Porcupine v1.3.0 timed on the history JSON files of `shardcheck bench --write-histories`.
// Measurement only: it is not part of shardcheck and no test runs it (see README.md here).
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"syscall"
	"time"

	"github.com/anishathalye/porcupine"
)

// ---- input / output / state representation --------------------------------

const (
	opPut = iota
	opDelete
	opGet      // get, get_async, get_sync
	opContains // contains
	opBatch    // get_batch (multi-key, split per key by Partition)
)

type kvInput struct {
	kind  int
	key   string   // single-key ops
	keys  []string // opBatch
	value string   // opPut
}

// Outputs: for opGet a value: nil (miss) or string (hex bytes); for opContains
// a bool; for opBatch a []interface{} of values; unknownOut for an op that
// never completed / raised (matches anything); malformedOut matches nothing.
type unknownT struct{}
type malformedT struct{}

var unknownOut interface{} = unknownT{}
var malformedOut interface{} = malformedT{}

// State of one key's register: nil (miss) or string (hex of the bytes).

func step(state, input, output interface{}) (bool, interface{}) {
	in := input.(kvInput)
	switch in.kind {
	case opPut:
		return true, in.value
	case opDelete:
		return true, nil
	case opGet:
		if output == unknownOut {
			return true, state
		}
		return output == state, state
	case opContains:
		if output == unknownOut {
			return true, state
		}
		b, ok := output.(bool)
		if !ok {
			return false, state
		}
		return (state != nil) == b, state
	}
	panic("step: op kind not per-key")
}

func equal(a, b interface{}) bool { return a == b }

func hash(s interface{}) uint64 {
	if s == nil {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(s.(string)))
	return h.Sum64() | 1
}

// partition: one partition per key (in order of first appearance); a
// get_batch is split into one get per key with the op's same interval.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	index := map[string]int{}
	var parts [][]porcupine.Operation
	add := func(key string, op porcupine.Operation) {
		i, ok := index[key]
		if !ok {
			i = len(parts)
			index[key] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	for _, op := range history {
		in := op.Input.(kvInput)
		if in.kind != opBatch {
			add(in.key, op)
			continue
		}
		outs, isList := op.Output.([]interface{})
		if op.Output != unknownOut && (!isList || len(outs) != len(in.keys)) {
			// malformed answer: a read of its first key that nothing answers
			add(in.keys[0], porcupine.Operation{ClientId: op.ClientId, Call: op.Call, Return: op.Return,
				Input: kvInput{kind: opGet, key: in.keys[0]}, Output: malformedOut})
			continue
		}
		for j, k := range in.keys {
			out := unknownOut
			if op.Output != unknownOut {
				out = outs[j]
			}
			add(k, porcupine.Operation{ClientId: op.ClientId, Call: op.Call, Return: op.Return,
				Input: kvInput{kind: opGet, key: k}, Output: out})
		}
	}
	return parts
}

func makeModel(useHash bool) porcupine.Model {
	m := porcupine.Model{
		Partition: partition,
		Init:      func() interface{} { return nil },
		Step:      step,
		Equal:     equal,
		DescribeOperation: func(input, output interface{}) string {
			return fmt.Sprintf("%+v -> %v", input, output)
		},
	}
	if useHash {
		m.Hash = hash
	}
	return m
}

// ---- parsing (not timed) ----------------------------------------------------

type jsonOp struct {
	ID          int             `json:"id"`
	Caller      string          `json:"caller"`
	Path        string          `json:"path"`
	Keys        []string        `json:"keys"`
	Value       *string         `json:"value"`
	Invoked     float64         `json:"invoked"`
	Completed   *float64        `json:"completed"`
	Result      json.RawMessage `json:"result"`
	Error       json.RawMessage `json:"error"`
	Completions int             `json:"completions"`
}

type jsonFile struct {
	Spec    json.RawMessage `json:"spec"`
	History []jsonOp        `json:"history"`
}

// value of a read result: null -> nil (miss), {"$hex": h} -> h, else malformed
func parseValue(raw json.RawMessage) interface{} {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var h struct {
		Hex *string `json:"$hex"`
	}
	if err := json.Unmarshal(raw, &h); err != nil || h.Hex == nil {
		return malformedOut
	}
	return *h.Hex
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

func load(path string, dropUnknownReads bool) ([]porcupine.Operation, int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	var f jsonFile
	if err := json.Unmarshal(data, &f); err != nil {
		var bare []jsonOp // also accept a bare list of ops
		if err2 := json.Unmarshal(data, &bare); err2 != nil {
			return nil, 0, err
		}
		f.History = bare
	}
	// timestamps -> ranks (exact order and ties of the float times kept)
	var times []float64
	for _, o := range f.History {
		times = append(times, o.Invoked)
		if o.Completed != nil {
			times = append(times, *o.Completed)
		}
	}
	sort.Float64s(times)
	rank := map[float64]int64{}
	var r int64
	for i, t := range times {
		if i == 0 || t != times[i-1] {
			r++
			rank[t] = r
		}
	}
	pendingReturn := r + 1 // after every other event
	callers := map[string]int{}
	var ops []porcupine.Operation
	for _, o := range f.History {
		cid, ok := callers[o.Caller]
		if !ok {
			cid = len(callers)
			callers[o.Caller] = cid
		}
		unknown := o.Completed == nil || !isNull(o.Error)
		ret := pendingReturn
		if !unknown {
			ret = rank[*o.Completed]
		}
		op := porcupine.Operation{ClientId: cid, Call: rank[o.Invoked], Return: ret}
		if len(o.Keys) == 0 {
			return nil, 0, fmt.Errorf("%s: op %d has no keys", path, o.ID)
		}
		switch o.Path {
		case "put":
			v := ""
			if o.Value != nil {
				v = *o.Value
			}
			op.Input = kvInput{kind: opPut, key: o.Keys[0], value: v}
		case "delete":
			op.Input = kvInput{kind: opDelete, key: o.Keys[0]}
		case "get", "get_async", "get_sync", "contains", "get_batch":
			if unknown && dropUnknownReads {
				continue
			}
			op.Input = readInput(o)
			op.Output = unknownOut
			if !unknown {
				op.Output = readOutput(o)
			}
		default:
			return nil, 0, fmt.Errorf("%s: op %d: path %q not modelled", path, o.ID, o.Path)
		}
		ops = append(ops, op)
	}
	return ops, len(f.History), nil
}

// readInput is a read's input: a get or contains of its key, or a get_batch of its keys.
func readInput(o jsonOp) kvInput {
	switch o.Path {
	case "contains":
		return kvInput{kind: opContains, key: o.Keys[0]}
	case "get_batch":
		return kvInput{kind: opBatch, key: o.Keys[0], keys: o.Keys}
	}
	return kvInput{kind: opGet, key: o.Keys[0]}
}

// readOutput is what a completed read answered: a value (get), a bool (contains), a value per key (get_batch), or
// malformedOut when the answer is not of that form.
func readOutput(o jsonOp) interface{} {
	switch o.Path {
	case "contains":
		var b bool
		if err := json.Unmarshal(o.Result, &b); err != nil {
			return malformedOut
		}
		return b
	case "get_batch":
		var raws []json.RawMessage
		if err := json.Unmarshal(o.Result, &raws); err != nil {
			return malformedOut
		}
		vals := make([]interface{}, len(raws))
		for i, x := range raws {
			vals[i] = parseValue(x)
		}
		return vals
	}
	return parseValue(o.Result)
}

// ---- timing -----------------------------------------------------------------

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func main() {
	timeout := flag.Duration("timeout", 60*time.Second, "Porcupine timeout per check")
	nSmall := flag.Int("n", 20, "runs per file of <= 10k ops (best of)")
	nBig := flag.Int("nbig", 3, "runs per file of > 10k ops (best of)")
	noHash := flag.Bool("nohash", false, "do not give Porcupine a state Hash (v1.3.0 Model.Hash)")
	dropUnknown := flag.Bool("drop-unknown-reads", false, "leave out reads that never completed / raised (instead of output 'unknown')")
	freeOS := flag.Bool("free-os-memory", false, "return the heap to the OS before each run (each run starts cold, like a fresh process)")
	header := flag.Bool("header", true, "print the TSV header")
	flag.Parse()
	if *nSmall < 1 || *nBig < 1 {
		fmt.Fprintf(os.Stderr, "shardcheck-porcupine: -n and -nbig must be at least 1, not %d and %d\n", *nSmall, *nBig)
		os.Exit(2)
	}
	runtime.GOMAXPROCS(1)
	model := makeModel(!*noHash)
	if *header {
		fmt.Println("file\tops\tverdict\tbest_cpu_s\tbest_wall_s\truns")
	}
	for _, path := range flag.Args() {
		ops, n, err := load(path, *dropUnknown)
		if err != nil {
			fmt.Fprintf(os.Stderr, "shardcheck-porcupine: %v\n", err)
			os.Exit(2)
		}
		runs := *nSmall
		if n > 10000 {
			runs = *nBig
		}
		bestCPU, bestWall := time.Duration(1<<62), time.Duration(1<<62)
		var verdict porcupine.CheckResult
		done := 0
		for i := 0; i < runs; i++ {
			runtime.GC()
			if *freeOS {
				debug.FreeOSMemory()
			}
			time.Sleep(20 * time.Millisecond) // let goroutines of a cancelled run finish
			c0, w0 := cpuNow(), time.Now()
			res := porcupine.CheckOperationsTimeout(model, ops, *timeout)
			wall, cpu := time.Since(w0), cpuNow()-c0
			done++
			if i > 0 && res != verdict {
				fmt.Fprintf(os.Stderr, "%s: verdict changed between runs: %s then %s\n", path, verdict, res)
			}
			verdict = res
			if cpu < bestCPU {
				bestCPU = cpu
			}
			if wall < bestWall {
				bestWall = wall
			}
			if res == porcupine.Unknown {
				break // timed out: no point repeating
			}
		}
		v := map[porcupine.CheckResult]string{porcupine.Ok: "ok", porcupine.Illegal: "violated", porcupine.Unknown: "unknown"}[verdict]
		fmt.Printf("%s\t%d\t%s\t%.6f\t%.6f\t%d\n", filepath.Base(path), n, v, bestCPU.Seconds(), bestWall.Seconds(), done)
	}
}
