package spec

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"time"
)

// SchemaID is the $id of the generated JSON Schema.
const SchemaID = "https://raydrop.dev/schemas/jobspec.v1.json"

// Schema returns the JSON Schema (draft 2020-12) of the job spec, generated
// from the same struct tags that drive Validate, with every default filled in.
func Schema() []byte {
	def := reflect.ValueOf(Defaults())
	s := structSchema(def.Type(), def)
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	s["$id"] = SchemaID
	s["title"] = "raydrop job spec " + APIVersion
	s["description"] = "A fine-tuning job for raydrop: drop it into the intake bucket as jobs/<name>.json or publish it to the requests topic."
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func structSchema(t reflect.Type, def reflect.Value) map[string]any {
	props := map[string]any{}
	var required []string
	for _, f := range fieldsOf(t).list {
		fs := fieldSchema(f, def.Field(f.index))
		props[f.name] = fs
		if f.rules.required {
			required = append(required, f.name)
		}
	}
	s := map[string]any{
		"type":                 "object",
		"properties":           props,
		"additionalProperties": false,
	}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

func fieldSchema(f field, def reflect.Value) map[string]any {
	var s map[string]any
	r := f.rules
	switch {
	case f.typ == durationType:
		s = map[string]any{"type": "string", "pattern": `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`}
		s["description"] = f.doc + " A duration from " + r.min + " to " + r.max + "."
		s["default"] = time.Duration(def.Int()).String()
		return s
	case f.typ.Kind() == reflect.Struct:
		s = structSchema(f.typ, def)
	case f.typ.Kind() == reflect.Slice:
		var item map[string]any
		switch f.typ.Elem().Kind() {
		case reflect.String:
			item = map[string]any{"type": "string", "minLength": 1}
			if k, ok := kinds[r.kind]; ok {
				item["pattern"] = k.pattern
			}
		case reflect.Float64:
			item = map[string]any{"type": "number"}
		default:
			item = structSchema(f.typ.Elem(), reflect.New(f.typ.Elem()).Elem())
			for _, fs := range item["properties"].(map[string]any) {
				delete(fs.(map[string]any), "default") // an item's fields have no defaults of their own
			}
		}
		s = map[string]any{"type": "array", "items": item}
		if r.min != "" {
			n, _ := strconv.Atoi(r.min)
			s["minItems"] = n
		}
		if r.max != "" {
			n, _ := strconv.Atoi(r.max)
			s["maxItems"] = n
		}
	case f.typ.Kind() == reflect.String:
		s = map[string]any{"type": "string"}
		if len(r.enum) > 0 {
			s["enum"] = r.enum
		} else if k, ok := kinds[r.kind]; ok {
			s["pattern"] = k.pattern
			if r.optional {
				s["pattern"] = "^$|" + k.pattern
			}
		}
		if r.max != "" {
			n, _ := strconv.Atoi(r.max)
			s["maxLength"] = n
		}
		if !r.optional {
			s["minLength"] = 1
		}
	case f.typ.Kind() == reflect.Int:
		s = map[string]any{"type": "integer"}
		addBounds(s, r)
	case f.typ.Kind() == reflect.Float64:
		s = map[string]any{"type": "number"}
		addBounds(s, r)
	case f.typ.Kind() == reflect.Bool:
		s = map[string]any{"type": "boolean"}
	}
	if f.doc != "" {
		s["description"] = f.doc
	}
	if f.typ.Kind() == reflect.Slice {
		b, _ := json.Marshal(def.Interface())
		s["default"] = json.RawMessage(b)
	} else if f.typ.Kind() != reflect.Struct && !r.required {
		s["default"] = def.Interface()
	}
	return s
}

func addBounds(s map[string]any, r rules) {
	num := func(v string) json.Number { return json.Number(v) }
	if r.min != "" {
		s["minimum"] = num(r.min)
	}
	if r.gt != "" {
		s["exclusiveMinimum"] = num(r.gt)
	}
	if r.max != "" {
		s["maximum"] = num(r.max)
	}
}
