package kubetest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	admissionclient "k8s.io/client-go/kubernetes/typed/admissionregistration/v1"
	coreclient "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

// AutopilotPolicyName names the ValidatingAdmissionPolicy (and its
// binding) that plays GKE Autopilot's check of a GPU pod's ephemeral
// storage request.
const AutopilotPolicyName = "raydrop-autopilot-ephemeral-storage"

// AutopilotRefusal starts the message of every pod the policy refuses.
const AutopilotRefusal = "GKE Autopilot refuses the pod"

// AutopilotPolicy is the policy and its binding: a pod that selects GPU
// nodes (cloud.google.com/gke-accelerator) and whose containers request
// more ephemeral storage in all than its node class allows
// (spec.NodeClasses: on local SSD when it selects
// cloud.google.com/gke-ephemeral-storage-local-ssd, else on the boot disk)
// is refused at creation, as Autopilot refuses a pod whose requests exceed
// its maxima
// (https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-resource-requests,
// "Minimum and maximum resource requests"). Real Autopilot answers from its
// own admission webhook, with another message.
func AutopilotPolicy() (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	ssd := map[string]int64{}
	for accel, c := range spec.NodeClasses {
		if c.LocalSSD {
			ssd[accel] = c.MaxEphemeralGi
		}
	}
	var entries []string
	for _, accel := range slices.Sorted(maps.Keys(ssd)) {
		entries = append(entries, strconv.Quote(accel)+": "+strconv.FormatInt(ssd[accel], 10))
	}
	ssdMap := "{" + strings.Join(entries, ", ") + "}"
	sel := "object.spec.nodeSelector"
	inSel := func(key string) string {
		return "has(" + sel + ") && " + strconv.Quote(key) + " in " + sel
	}
	fail := admissionv1.Fail
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: AutopilotPolicyName},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
				},
			}}},
			MatchConditions: []admissionv1.MatchCondition{{Name: "gpu-pod", Expression: inSel(names.NodeAccelerator)}},
			Variables: []admissionv1.Variable{
				{Name: "accel", Expression: sel + "[" + strconv.Quote(names.NodeAccelerator) + "]"},
				{Name: "localSSD", Expression: inSel(spec.NodeEphemeralLocalSSD) + " && " + sel + "[" + strconv.Quote(spec.NodeEphemeralLocalSSD) + "] == 'true'"},
				{Name: "maxGi", Expression: "variables.localSSD && variables.accel in " + ssdMap + " ? " + ssdMap + "[variables.accel] : " + strconv.Itoa(spec.BootDiskEphemeralGi)},
				{Name: "requested", Expression: "object.spec.containers.map(c, has(c.resources) && has(c.resources.requests) && 'ephemeral-storage' in c.resources.requests ? quantity(c.resources.requests['ephemeral-storage']).asApproximateFloat() : 0.0).sum()"},
			},
			Validations: []admissionv1.Validation{{
				Expression: "variables.requested <= double(variables.maxGi) * 1073741824.0",
				MessageExpression: "'" + AutopilotRefusal + ": its containers request ' + string(int(variables.requested / 1073741824.0)) + 'Gi of ephemeral storage, more than the ' + " +
					"string(variables.maxGi) + 'Gi allowed on ' + variables.accel + ' nodes with ephemeral storage on ' + (variables.localSSD ? 'local SSD' : 'the boot disk')",
				Reason: ptr(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: AutopilotPolicyName},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        AutopilotPolicyName,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	return policy, binding
}

// InstallAutopilotPolicy creates AutopilotPolicy on the API server and
// returns once it refuses an oversized pod (a server-side dry run), which
// takes the API server a moment after the create.
func InstallAutopilotPolicy(ctx context.Context, cfg *rest.Config) error {
	ac, err := admissionclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("admission client: %w", err)
	}
	policy, binding := AutopilotPolicy()
	if _, err := ac.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create validating admission policy: %w", err)
	}
	if _, err := ac.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create validating admission policy binding: %w", err)
	}
	cc, err := coreclient.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("core client: %w", err)
	}
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "autopilot-policy-probe", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{names.NodeAccelerator: "nvidia-b200"},
			Containers: []corev1.Container{{Name: "probe", Image: "probe", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("100Ti")},
			}}},
		},
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cc.Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), AutopilotRefusal) {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				return fmt.Errorf("admission policy %s not in force after 30s: an oversized pod was admitted", AutopilotPolicyName)
			}
			return fmt.Errorf("admission policy %s not in force after 30s: an oversized pod got %w", AutopilotPolicyName, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func ptr[T any](v T) *T { return &v }
