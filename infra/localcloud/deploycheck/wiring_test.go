package deploycheck

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// TestHCLMatchesWiring checks the deployment (infra/gcp/functions.tf)
// against the wiring table the functions, the local cloud and the flow
// tests are built from: the same functions with the same entry points and
// topics they publish to, the same triggers, and a variable for every topic.
func TestHCLMatchesWiring(t *testing.T) {
	const path = "../../gcp/functions.tf"
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, path, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	attrs := map[string]*hclsyntax.Attribute{}
	for _, b := range f.Body.(*hclsyntax.Body).Blocks {
		if b.Type == "locals" {
			for name, a := range b.Body.Attributes {
				attrs[name] = a
			}
		}
	}
	value := func(name string) cty.Value {
		a, ok := attrs[name]
		if !ok {
			t.Fatalf("%s has no local %s", path, name)
		}
		v, diags := a.Expr.Value(nil)
		if diags.HasErrors() {
			t.Fatalf("local %s: %v", name, diags)
		}
		return v
	}
	str := func(v cty.Value) string {
		if v.IsNull() {
			return ""
		}
		return v.AsString()
	}

	fns := value("functions")
	if got, want := len(fns.AsValueMap()), len(wiring.Functions); got != want {
		t.Errorf("%s deploys %d functions, the wiring table has %d", path, got, want)
	}
	triggers := value("triggers").AsValueMap()
	nTriggers := 0
	for _, fn := range wiring.Functions {
		hf, ok := fns.AsValueMap()[fn.Name]
		if !ok {
			t.Errorf("%s does not deploy function %s", path, fn.Name)
			continue
		}
		if ep := str(hf.GetAttr("entry_point")); ep != fn.EntryPoint {
			t.Errorf("function %s: entry point %q in HCL, %q in the wiring table", fn.Name, ep, fn.EntryPoint)
		}
		var pubs []string
		for _, v := range hf.GetAttr("publishes").AsValueSlice() {
			pubs = append(pubs, v.AsString())
		}
		if !sameSet(pubs, fn.Publishes) {
			t.Errorf("function %s publishes to %v in HCL, %v in the wiring table", fn.Name, pubs, fn.Publishes)
		}
		if hf.GetAttr("reads_artifacts").True() != fn.ReadsArtifacts {
			t.Errorf("function %s: reads_artifacts differs from the wiring table (%v)", fn.Name, fn.ReadsArtifacts)
		}
		if hf.GetAttr("writes_reports").True() != fn.WritesReports {
			t.Errorf("function %s: writes_reports differs from the wiring table (%v)", fn.Name, fn.WritesReports)
		}
		checkKube(t, fn.Name+"'s Role", fn.Kube, hf.GetAttr("kube"))
		checkKube(t, fn.Name+"'s ClusterRole", fn.KubeCluster, hf.GetAttr("kube_cluster"))
		for _, tr := range fn.Triggers {
			nTriggers++
			ht, ok := triggers[tr.Name]
			if !ok {
				t.Errorf("%s has no trigger %s", path, tr.Name)
				continue
			}
			if got := str(ht.GetAttr("function")); got != fn.Name {
				t.Errorf("trigger %s goes to %s in HCL, to %s in the wiring table", tr.Name, got, fn.Name)
			}
			if topic, bucket := str(ht.GetAttr("topic")), str(ht.GetAttr("bucket")); topic != tr.Topic || bucket != tr.Bucket {
				t.Errorf("trigger %s: topic %q bucket %q in HCL, %q %q in the wiring table", tr.Name, topic, bucket, tr.Topic, tr.Bucket)
			}
		}
	}
	if len(triggers) != nTriggers {
		t.Errorf("%s has %d triggers, the wiring table %d", path, len(triggers), nTriggers)
	}
	groups := value("kube_api_groups").AsValueMap()
	for r, g := range groups {
		if want, ok := wiring.KubeGroups[r]; !ok || g.AsString() != want {
			t.Errorf("kube_api_groups: %s is in group %q in HCL, %q in the wiring table", r, g.AsString(), want)
		}
	}
	for r := range wiring.KubeGroups {
		if _, ok := groups[r]; !ok {
			t.Errorf("kube_api_groups has no group for %s", r)
		}
	}
	checkIAM(t, f.Body.(*hclsyntax.Body), src)
	env := attrs["function_env"]
	if env == nil {
		t.Fatalf("%s has no local function_env", path)
	}
	envSrc := string(env.SrcRange.SliceBytes(src))
	for _, k := range wiring.TopicKeys {
		if !strings.Contains(envSrc, wiring.TopicEnv(k)+" ") {
			t.Errorf("function_env does not set %s", wiring.TopicEnv(k))
		}
	}
	for _, v := range []string{"RAYDROP_OUTPUT_BUCKETS", "RAYDROP_NAMESPACES", "RAYDROP_STATE_BUCKET"} {
		if !strings.Contains(envSrc, v+" ") {
			t.Errorf("function_env does not set %s", v)
		}
	}
	main, err := os.ReadFile("../../gcp/main.tf")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(main), `object_name_prefix = "`+names.NoticePrefix+`"`) {
		t.Errorf("the checkpoint bucket's notification is not filtered to the mark notices (%s)", names.NoticePrefix)
	}
	if !strings.Contains(string(src), `account_id   = "raydrop-${each.key}"`) {
		t.Errorf("the functions' service accounts are not raydrop-<function> (wiring.Function.Identity)")
	}
}

// checkIAM checks the functions' Google Cloud roles in the HCL: each
// binding's role and bucket, and the selection of functions it applies to,
// as the table says (state bucket: every function; intake bucket: the
// functions its objects trigger, to read; checkpoint bucket: those that
// read it, and the reports' writer, to create them; topics: what each publishes; the cluster: find and connect
// only). No project-wide Kubernetes role may remain.
func checkIAM(t *testing.T, body *hclsyntax.Body, src []byte) {
	t.Helper()
	want := map[string]struct{ role, target, selects string }{
		"google_storage_bucket_iam_member.state_admin":              {"roles/storage.objectAdmin", "google_storage_bucket.state.name", "local.functions"},
		"google_storage_bucket_iam_member.intake_viewer":            {"roles/storage.objectViewer", "google_storage_bucket.intake.name", `t.bucket == "intake"`},
		"google_storage_bucket_iam_member.artifacts_viewer":         {"roles/storage.objectViewer", "google_storage_bucket.artifacts.name", "f.reads_artifacts"},
		"google_storage_bucket_iam_member.artifacts_report_creator": {"roles/storage.objectCreator", "google_storage_bucket.artifacts.name", "f.writes_reports"},
		"google_pubsub_topic_iam_member.publisher":                  {"roles/pubsub.publisher", "google_pubsub_topic.topics[each.value.topic].id", "local.publisher_bindings"},
		"google_project_iam_member.cluster_viewer":                  {"roles/container.clusterViewer", "var.project_id", "local.functions"},
	}
	text := func(a *hclsyntax.Attribute) string {
		if a == nil {
			return ""
		}
		return string(a.Expr.Range().SliceBytes(src))
	}
	seen := map[string]bool{}
	for _, b := range body.Blocks {
		if b.Type != "resource" || len(b.Labels) != 2 {
			continue
		}
		key := b.Labels[0] + "." + b.Labels[1]
		w, ok := want[key]
		if !ok {
			continue
		}
		seen[key] = true
		a := b.Body.Attributes
		target := text(a["bucket"]) + text(a["topic"]) + text(a["project"])
		if role := strings.Trim(text(a["role"]), `"`); role != w.role || target != w.target || !strings.Contains(text(a["for_each"]), w.selects) {
			t.Errorf("%s: role %s on %s for %s; want %s on %s for %s", key, role, target, text(a["for_each"]), w.role, w.target, w.selects)
		}
	}
	for key := range want {
		if !seen[key] {
			t.Errorf("functions.tf has no %s", key)
		}
	}
	if strings.Contains(string(src), `"roles/container.developer"`) {
		t.Error("functions.tf grants roles/container.developer (every namespace, every Secret)")
	}
}

// checkKube checks a function's Kubernetes verbs in HCL (its Role or its
// ClusterRole) against the wiring table's.
func checkKube(t *testing.T, what string, want map[string][]string, kube cty.Value) {
	t.Helper()
	got := map[string][]string{}
	if !kube.IsNull() {
		for r, verbs := range kube.AsValueMap() {
			for _, v := range verbs.AsValueSlice() {
				got[r] = append(got[r], v.AsString())
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: Kubernetes resources %v in HCL, %v in the wiring table", what, got, want)
	}
	for r, verbs := range want {
		if !sameSet(got[r], verbs) {
			t.Errorf("%s: verbs on %s %v in HCL, %v in the wiring table", what, r, got[r], verbs)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
