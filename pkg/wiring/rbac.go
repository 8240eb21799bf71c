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
	resources := make([]string, 0, len(f.Kube))
	for r := range f.Kube {
		resources = append(resources, r)
	}
	slices.Sort(resources)
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "raydrop-" + f.Name, Namespace: namespace}}
	for _, r := range resources {
		role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{KubeGroups[r]}, Resources: []string{r}, Verbs: slices.Clone(f.Kube[r])})
	}
	return role
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
