package manifests

import (
	"bytes"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/spec"
)

// Objects are the objects of one attempt of a run, in the order they must
// be applied.
func Objects(s *spec.JobSpec, run Run, code Code) []runtime.Object {
	return []runtime.Object{
		TrainerConfigMap(s, code),
		RayCluster(s, code, run.Tier),
		RayJob(s, run),
	}
}

// YAML writes objects as one multi-document YAML stream that kubectl apply
// accepts, without the empty status and null fields typed objects carry.
func YAML(objs []runtime.Object) ([]byte, error) {
	var buf bytes.Buffer
	for i, o := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, fmt.Errorf("convert %T: %w", o, err)
		}
		delete(m, "status")
		prune(m)
		b, err := yaml.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("marshal %T: %w", o, err)
		}
		if i > 0 {
			buf.WriteString("---\n")
		}
		buf.Write(b)
	}
	return buf.Bytes(), nil
}

// prune drops null values, recursively.
func prune(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		for k, x := range t {
			if prune(x) {
				delete(t, k)
			}
		}
		return false
	case []any:
		for _, x := range t {
			prune(x)
		}
	}
	return false
}
