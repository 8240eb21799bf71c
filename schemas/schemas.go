// Package schemas holds the JSON Schemas of raydrop's contracts, for the
// tests that check documents against them. The completion mark's schema
// (mark.v1.json) is written by hand: it is the contract between the
// trainer that writes raydrop_result.json, the local cloud's simulated
// trainer that writes it the same way, and pkg/checkpoints that reads it;
// each checks its marks against it in its tests. The evidence manifest's
// (evidence.v1.json) is pkg/evidence's contract with whoever reads a run's
// evidence folder.
package schemas

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Mark is the completion mark's JSON Schema (draft 2020-12).
//
//go:embed mark.v1.json
var Mark []byte

// MarkID is the mark schema's $id.
const MarkID = "https://raydrop.dev/schemas/mark.v1.json"

var mark = sync.OnceValues(func() (*jsonschema.Schema, error) { return compile(MarkID, Mark) })

// ValidateMark reports how doc, a raydrop_result.json, breaks the mark's
// schema; nil when it does not.
func ValidateMark(doc []byte) error { return validate(mark, "mark", doc) }

// Evidence is the evidence manifest's JSON Schema (draft 2020-12).
//
//go:embed evidence.v1.json
var Evidence []byte

// EvidenceID is the evidence manifest schema's $id.
const EvidenceID = "https://raydrop.dev/schemas/evidence.v1.json"

var evidence = sync.OnceValues(func() (*jsonschema.Schema, error) { return compile(EvidenceID, Evidence) })

// ValidateEvidence reports how doc, an evidence manifest.json, breaks its
// schema; nil when it does not.
func ValidateEvidence(doc []byte) error { return validate(evidence, "evidence manifest", doc) }

// compile compiles the schema doc whose $id is id.
func compile(id string, schema []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(id, doc); err != nil {
		return nil, err
	}
	return c.Compile(id)
}

// validate checks doc against a compiled schema.
func validate(schema func() (*jsonschema.Schema, error), name string, doc []byte) error {
	s, err := schema()
	if err != nil {
		return fmt.Errorf("%s schema: %w", name, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return s.Validate(v)
}

// MarkProperties are the properties the schema defines at a path of
// property names ("" for the mark itself, "data", "samples"): the fields a
// reader of the mark may rely on.
func MarkProperties(path ...string) (map[string]bool, error) {
	var node map[string]any
	if err := json.Unmarshal(Mark, &node); err != nil {
		return nil, err
	}
	for _, p := range path {
		props, _ := node["properties"].(map[string]any)
		next, _ := props[p].(map[string]any)
		// A nullable object is oneOf null and the object.
		if alts, ok := next["oneOf"].([]any); ok {
			for _, a := range alts {
				if m, _ := a.(map[string]any); m["type"] == "object" {
					next = m
				}
			}
		}
		if next == nil {
			return nil, fmt.Errorf("the mark schema has no property %q", p)
		}
		node = next
	}
	out := map[string]bool{}
	props, _ := node["properties"].(map[string]any)
	for k := range props {
		out[k] = true
	}
	return out, nil
}
