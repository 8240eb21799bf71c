package spec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxDepth bounds JSON nesting; a job spec is four levels deep.
const maxDepth = 32

// Parse decodes a job spec strictly over Defaults and validates it. On any
// problem it returns Problems listing every one found.
func Parse(data []byte) (*JobSpec, error) {
	if len(data) > MaxBytes {
		return nil, Problems{{Path: rootPath, Message: fmt.Sprintf("spec is %d bytes (at most %d)", len(data), MaxBytes)}}
	}
	if !utf8.Valid(data) {
		off := invalidUTF8Offset(data)
		return nil, Problems{{Path: rootPath, Message: fmt.Sprintf("not valid UTF-8 at byte %d (a spec must be UTF-8 JSON)", off)}}
	}
	tree, err := parseTree(data)
	if err != nil {
		return nil, err
	}
	var ps Problems
	checkShape(tree, reflect.TypeOf(JobSpec{}), "", &ps)
	if len(ps) > 0 {
		return nil, append(ps, remainingProblems(data, ps)...)
	}
	s := Defaults()
	// apiVersion must be written out, never taken from the defaults.
	s.APIVersion = ""
	if err := json.Unmarshal(data, &s); err != nil {
		// checkShape accepted the document, so this is a bug, not bad input.
		return nil, fmt.Errorf("decode spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// node is a parsed JSON value that keeps object members in document order
// and remembers duplicates, which encoding/json silently merges.
type node struct {
	kind    string // object, array, string, number, boolean, null
	members []member
	items   []*node
	num     json.Number
}

type member struct {
	key string
	val *node
}

func parseTree(data []byte) (*node, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var ps Problems
	n, err := parseValue(dec, rootPath, 0, &ps)
	if err != nil {
		return nil, Problems{{Path: rootPath, Message: describeSyntaxError(data, err)}}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, Problems{{Path: rootPath, Message: fmt.Sprintf("unexpected data after the JSON object at byte %d (one JSON object per spec)", dec.InputOffset())}}
	}
	if len(ps) > 0 {
		return nil, ps
	}
	return n, nil
}

func parseValue(dec *json.Decoder, path string, depth int, ps *Problems) (*node, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nesting deeper than %d levels", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &node{kind: "object"}
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key := kt.(string)
				child := joinPath(path, key)
				v, err := parseValue(dec, child, depth+1, ps)
				if err != nil {
					return nil, err
				}
				if seen[key] {
					*ps = append(*ps, Problem{Path: child, Message: "duplicate key (each field may appear once)"})
					continue
				}
				seen[key] = true
				n.members = append(n.members, member{key: key, val: v})
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return n, nil
		case '[':
			n := &node{kind: "array"}
			for i := 0; dec.More(); i++ {
				v, err := parseValue(dec, fmt.Sprintf("%s[%d]", path, i), depth+1, ps)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return n, nil
		}
	case string:
		return &node{kind: "string"}, nil
	case json.Number:
		return &node{kind: "number", num: t}, nil
	case bool:
		return &node{kind: "boolean"}, nil
	case nil:
		return &node{kind: "null"}, nil
	}
	return nil, fmt.Errorf("unexpected token %v", tok)
}

func describeSyntaxError(data []byte, err error) string {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		line, col := lineCol(data, se.Offset)
		return fmt.Sprintf("invalid JSON at line %d, column %d: %s", line, col, se.Error())
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		if len(bytes.TrimSpace(data)) == 0 {
			return "empty document (a spec is a JSON object)"
		}
		return "truncated JSON: the document ends before its last value is closed"
	default:
		return "invalid JSON: " + err.Error()
	}
}

func lineCol(data []byte, offset int64) (int, int) {
	if offset > int64(len(data)) {
		offset = int64(len(data))
	}
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	col := int(offset) - bytes.LastIndexByte(before, '\n')
	return line, col
}

func invalidUTF8Offset(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(data)
}

// checkShape compares a parsed document with the Go type it must decode into
// and records unknown fields, wrong types and non-integral numbers.
func checkShape(n *node, t reflect.Type, path string, ps *Problems) {
	p := displayPath(path)
	want := jsonKind(t)
	if n.kind == "null" {
		*ps = append(*ps, Problem{Path: p, Message: fmt.Sprintf("null is not allowed (give %s, or omit the field for its default)", article(want))})
		return
	}
	if n.kind != want && (n.kind != "number" || want != "integer") {
		*ps = append(*ps, Problem{Path: p, Message: fmt.Sprintf("must be %s, not %s", article(want), article(n.kind))})
		return
	}
	switch want {
	case "object":
		fields := fieldsOf(t)
		for _, m := range n.members {
			f, ok := fields.byName[m.key]
			if !ok {
				*ps = append(*ps, Problem{Path: joinPath(path, m.key), Message: unknownFieldMessage(m.key, fields.names)})
				continue
			}
			checkShape(m.val, f.typ, joinPath(path, m.key), ps)
		}
	case "array":
		for i, item := range n.items {
			checkShape(item, t.Elem(), indexPath(path, i), ps)
		}
	case "integer":
		s := n.num.String()
		if strings.ContainsAny(s, ".eE") {
			*ps = append(*ps, Problem{Path: p, Message: fmt.Sprintf("must be a whole number, not %s", s)})
			return
		}
		if _, err := strconv.ParseInt(s, 10, 64); err != nil {
			*ps = append(*ps, Problem{Path: p, Message: fmt.Sprintf("%s is out of range for a whole number", s)})
		}
	case "number":
		if _, err := strconv.ParseFloat(n.num.String(), 64); err != nil {
			*ps = append(*ps, Problem{Path: p, Message: fmt.Sprintf("%s is out of range for a number", n.num)})
		}
	}
}

// jsonKind names the JSON type a Go type decodes from, in schema terms.
func jsonKind(t reflect.Type) string {
	if t == durationType {
		return "string"
	}
	switch t.Kind() {
	case reflect.Struct:
		return "object"
	case reflect.Slice:
		return "array"
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "integer"
	case reflect.Float64:
		return "number"
	case reflect.Bool:
		return "boolean"
	}
	panic("spec: unsupported field type " + t.String())
}

func unknownFieldMessage(key string, allowed []string) string {
	var b strings.Builder
	b.WriteString("unknown field")
	if s := closest(key, allowed); s != "" {
		fmt.Fprintf(&b, " (did you mean %q?)", s)
	}
	sorted := append([]string(nil), allowed...)
	sort.Strings(sorted)
	fmt.Fprintf(&b, " (allowed: %s)", strings.Join(sorted, ", "))
	return b.String()
}

// closest returns the allowed name nearest to key when it is near enough to
// be a likely typo, else "".
func closest(key string, allowed []string) string {
	best, bestD := "", 1<<30
	for _, a := range allowed {
		if strings.EqualFold(a, key) {
			return a
		}
		d := levenshtein(strings.ToLower(key), strings.ToLower(a))
		if d < bestD {
			best, bestD = a, d
		}
	}
	limit := 2
	if l := utf8.RuneCountInString(key) / 3; l > limit {
		limit = l
	}
	if bestD <= limit {
		return best
	}
	return ""
}

func levenshtein(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

func article(kind string) string {
	if strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}

// remainingProblems validates what is left of a document once the fields
// with shape problems are taken out, so one pass reports every problem:
// a misspelt field and a missing one alike.
func remainingProblems(data []byte, shape Problems) Problems {
	var m map[string]any
	var out Problems
	// A document that is not an object has only its shape problem.
	if isObject := json.Unmarshal(data, &m) == nil; !isObject {
		return out
	}
	for _, p := range shape {
		deletePath(m, p.Path)
	}
	s := Defaults()
	s.APIVersion = ""
	// m came from valid JSON, so it marshals; its values kept the right
	// types, so it decodes.
	b, _ := json.Marshal(m)
	_ = json.Unmarshal(b, &s)
	var vs Problems
	if errors.As(s.Validate(), &vs) {
		for _, v := range vs {
			if !coveredBy(v.Path, shape) {
				out = append(out, v)
			}
		}
	}
	return out
}

func deletePath(m map[string]any, path string) {
	parts := strings.Split(path, ".")
	for i, k := range parts {
		if i == len(parts)-1 {
			delete(m, k)
			return
		}
		next, ok := m[k].(map[string]any)
		if !ok {
			return
		}
		m = next
	}
}

// coveredBy reports whether a shape problem already speaks for path.
func coveredBy(path string, shape Problems) bool {
	for _, p := range shape {
		if path == p.Path || strings.HasPrefix(path, p.Path+".") {
			return true
		}
	}
	return false
}
