package manifests_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/raydrop/raydrop/pkg/kubetest"
	"github.com/raydrop/raydrop/pkg/manifests"
)

// TestServerSideDryRun sends the rendered YAML of the example, exactly as
// `raydrop render` prints it, to a real kube-apiserver with the KubeRay
// v1.5.0 CRDs, as a server-side dry-run create with strict field validation.
// The same objects with an unknown field or a wrong type must be refused,
// which shows the check can fail.
func TestServerSideDryRun(t *testing.T) {
	env, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop API server: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	create := func(u *unstructured.Unstructured) error {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		_, err = dyn.Resource(m.Resource).Namespace(u.GetNamespace()).Create(ctx, u, metav1.CreateOptions{
			DryRun:          []string{metav1.DryRunAll},
			FieldValidation: metav1.FieldValidationStrict,
		})
		return err
	}

	code, err := manifests.TrainerCode()
	if err != nil {
		t.Fatal(err)
	}
	s := exampleSpec(t)
	out, err := manifests.YAML(manifests.Objects(s, exampleRun(s), code))
	if err != nil {
		t.Fatal(err)
	}
	objs := decodeYAML(t, out)
	if len(objs) != 3 {
		t.Fatalf("rendered %d objects, want 3", len(objs))
	}
	for _, u := range objs {
		if err := create(u); err != nil {
			t.Errorf("API server refused %s %s: %v", u.GetKind(), u.GetName(), err)
		} else {
			t.Logf("API server accepted %s %s (dry run)", u.GetKind(), u.GetName())
		}
	}

	for _, u := range objs[1:] {
		bad := u.DeepCopy()
		if err := unstructured.SetNestedField(bad.Object, "surprise", "spec", "notAField"); err != nil {
			t.Fatal(err)
		}
		if err := create(bad); err == nil || !strings.Contains(err.Error(), "notAField") {
			t.Errorf("%s with an unknown field: got %v, want a strict-validation error", u.GetKind(), err)
		}
	}
	// Every capacity tier's RayCluster: its node selector and tolerations.
	ts := tieredSpec(t)
	for i, tier := range ts.Tiers() {
		out, err := manifests.YAML([]runtime.Object{manifests.RayCluster(ts, code, i)})
		if err != nil {
			t.Fatal(err)
		}
		u := decodeYAML(t, out)[0]
		if err := create(u); err != nil {
			t.Errorf("API server refused the RayCluster of tier %d (%s): %v", i, tier.Name(), err)
		}
	}

	bad := objs[1].DeepCopy()
	groups, _, _ := unstructured.NestedSlice(bad.Object, "spec", "workerGroupSpecs")
	groups[0].(map[string]any)["replicas"] = "two"
	_ = unstructured.SetNestedSlice(bad.Object, groups, "spec", "workerGroupSpecs")
	if err := create(bad); err == nil {
		t.Error("RayCluster with replicas \"two\" was accepted")
	}
}

func decodeYAML(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatal(err)
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}
