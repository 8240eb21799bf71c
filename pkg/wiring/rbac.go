package wiring

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Role is the function's Role in namespace: one rule per resource of its
// Kube table, nothing more. The deployment's HCL writes the same Roles
// (a test checks it against this table); the local cloud applies these.
func (f Function) Role(namespace string) *rbacv1.Role {
	return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "raydrop-" + f.Name, Namespace: namespace}, Rules: rules(f.Kube)}
}

// ClusterRole is the function's ClusterRole: one rule per resource of its
// KubeCluster table; nil for a function that has none.
func (f Function) ClusterRole() *rbacv1.ClusterRole {
	if len(f.KubeCluster) == 0 {
		return nil
	}
	return &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "raydrop-" + f.Name}, Rules: rules(f.KubeCluster)}
}

// ClusterRoleBinding binds the function's ClusterRole to user; nil for a
// function that has none.
func (f Function) ClusterRoleBinding(user string) *rbacv1.ClusterRoleBinding {
	if len(f.KubeCluster) == 0 {
		return nil
	}
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "raydrop-" + f.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "raydrop-" + f.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
}

// rules is one rule per resource of a verbs table, in name order.
func rules(verbs map[string][]string) []rbacv1.PolicyRule {
	resources := make([]string, 0, len(verbs))
	for r := range verbs {
		resources = append(resources, r)
	}
	slices.Sort(resources)
	var out []rbacv1.PolicyRule
	for _, r := range resources {
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{KubeGroups[r]}, Resources: []string{r}, Verbs: slices.Clone(verbs[r])})
	}
	return out
}

// RoleBinding binds the function's Role in namespace to user, the name its
// identity authenticates as.
func (f Function) RoleBinding(namespace, user string) *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "raydrop-" + f.Name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "raydrop-" + f.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
}
