package wiring

import (
	"slices"
	"testing"
)

// TestRolesAreTheTable: each function's Role holds exactly its Kube table,
// every resource in a known API group, and no function may touch Secrets
// or anything with a wildcard, nor pods beyond listing them, but for the
// monitor's delete of the head pod a failed run kept for a look (it may
// update RayClusters, which can remove any of their pods already).
func TestRolesAreTheTable(t *testing.T) {
	for _, f := range Functions {
		role := f.Role("ns")
		if role.Namespace != "ns" || role.Name != "raydrop-"+f.Name || len(role.Rules) != len(f.Kube) {
			t.Errorf("%s: role %s/%s with %d rules, want raydrop-%s in ns with %d", f.Name, role.Namespace, role.Name, len(role.Rules), f.Name, len(f.Kube))
		}
		for _, r := range role.Rules {
			if len(r.Resources) != 1 || len(r.APIGroups) != 1 {
				t.Fatalf("%s: rule %v is not one resource in one group", f.Name, r)
			}
			res := r.Resources[0]
			group, known := KubeGroups[res]
			if !known || r.APIGroups[0] != group {
				t.Errorf("%s: %s in group %q, known %v", f.Name, res, r.APIGroups[0], known)
			}
			if !slices.Equal(r.Verbs, f.Kube[res]) || slices.Contains(r.Verbs, "*") || len(r.Verbs) == 0 {
				t.Errorf("%s: verbs on %s %v, table %v", f.Name, res, r.Verbs, f.Kube[res])
			}
		}
		for res := range f.Kube {
			pods := []string{"list"}
			if f.Name == "monitor" {
				pods = []string{"delete", "list"}
			}
			if res == "secrets" || res == "*" || res == "pods" && !slices.Equal(f.Kube[res], pods) {
				t.Errorf("%s may use %s %v", f.Name, res, f.Kube[res])
			}
		}
		b := f.RoleBinding("ns", f.Identity("p"))
		if b.RoleRef.Name != role.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != "raydrop-"+f.Name+"@p.iam.gserviceaccount.com" || b.Subjects[0].Kind != "User" {
			t.Errorf("%s: binding %+v", f.Name, b)
		}
	}
}

// TestClusterRolesOnlyRead: a function's ClusterRole holds exactly its
// KubeCluster table, and that only reads nodes; a function without one
// gets neither a ClusterRole nor a binding.
func TestClusterRolesOnlyRead(t *testing.T) {
	for _, f := range Functions {
		role, b := f.ClusterRole(), f.ClusterRoleBinding(f.Identity("p"))
		if len(f.KubeCluster) == 0 {
			if role != nil || b != nil {
				t.Errorf("%s has no KubeCluster table but a ClusterRole %v or binding %v", f.Name, role, b)
			}
			continue
		}
		for res, verbs := range f.KubeCluster {
			if res != ResourceNodes || !slices.Equal(verbs, []string{"get"}) {
				t.Errorf("%s may %v cluster-wide %s; only get on nodes is allowed", f.Name, verbs, res)
			}
		}
		if role.Name != "raydrop-"+f.Name || len(role.Rules) != len(f.KubeCluster) {
			t.Errorf("%s: ClusterRole %s with %d rules", f.Name, role.Name, len(role.Rules))
		}
		if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != role.Name || len(b.Subjects) != 1 || b.Subjects[0].Name != f.Identity("p") {
			t.Errorf("%s: ClusterRoleBinding %+v", f.Name, b)
		}
	}
}
