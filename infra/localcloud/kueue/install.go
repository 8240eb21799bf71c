package kueue

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"
)

// conversionCRDs are the CRDs Kueue's shipped kustomization
// (config/components/crd/kustomization.yaml) serves through its conversion
// webhook, between v1beta1 and v1beta2.
var conversionCRDs = []string{
	"workloads.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io",
	"cohorts.kueue.x-k8s.io", "multikueueclusters.kueue.x-k8s.io",
}

// installCRDs installs Kueue's CRDs from its release's config
// (config/components/crd/bases), the five above with their conversion
// webhook at url, trusted through caPEM, as the shipped patches set it
// with the Service's address. It returns once the API server serves them.
func installCRDs(ctx context.Context, cfg *rest.Config, dir, url string, caPEM []byte) error {
	files, err := filepath.Glob(filepath.Join(dir, "crd", "*.yaml"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("kueue: no CRDs in %s (%w): run make tools", filepath.Join(dir, "crd"), err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("kueue: %w", err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return fmt.Errorf("kueue: %s: %w", f, err)
		}
		if slices.Contains(conversionCRDs, crd.Name) {
			crd.Spec.Conversion = &apiextensionsv1.CustomResourceConversion{
				Strategy: apiextensionsv1.WebhookConverter,
				Webhook: &apiextensionsv1.WebhookConversion{
					ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
					ConversionReviewVersions: []string{"v1"},
				},
			}
		}
		crds = append(crds, crd)
	}
	if n := countConversion(crds); n != len(conversionCRDs) {
		return fmt.Errorf("kueue: %d of the CRDs %v found in %s", n, conversionCRDs, dir)
	}
	_, err = envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{CRDs: crds, MaxTime: 2 * time.Minute})
	if err != nil {
		return fmt.Errorf("kueue: install CRDs: %w", err)
	}
	return nil
}

func countConversion(crds []*apiextensionsv1.CustomResourceDefinition) int {
	n := 0
	for _, c := range crds {
		if c.Spec.Conversion != nil {
			n++
		}
	}
	return n
}

// Webhooks are the paths of the admission webhooks of Kueue's release
// (config/components/webhook/manifests.yaml) that the local cloud
// installs: those of Kueue's own objects and of RayJobs. The others
// (pods, deployments, statefulsets, batch Jobs and the other frameworks)
// are left out: with failurePolicy Fail, each would refuse its objects
// whenever Kueue is down, and the manager serves only its enabled
// frameworks' paths.
func wanted(path string) bool {
	return strings.Contains(path, "-kueue-x-k8s-io-") || strings.HasSuffix(path, "-ray-io-v1-rayjob")
}

// installWebhooks creates the mutating and validating webhook
// configurations of the release, with the wanted webhooks only, each
// calling base+path and trusting caPEM, and returns how many it installed.
func installWebhooks(ctx context.Context, cs kubernetes.Interface, dir, base string, caPEM []byte) (int, error) {
	f := filepath.Join(dir, "webhook", "manifests.yaml")
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, fmt.Errorf("kueue: %w: run make tools", err)
	}
	api := cs.AdmissionregistrationV1()
	n := 0
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	for {
		raw, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return n, fmt.Errorf("kueue: %s: %w", f, err)
		}
		var doc metav1.TypeMeta
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return n, fmt.Errorf("kueue: %s: %w", f, err)
		}
		switch doc.Kind {
		case "MutatingWebhookConfiguration":
			c := &admissionv1.MutatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(raw, c); err != nil {
				return n, fmt.Errorf("kueue: %s: %w", f, err)
			}
			c.Name, c.Webhooks = "kueue-"+c.Name, keep(c.Webhooks, func(w *admissionv1.MutatingWebhook) *admissionv1.WebhookClientConfig { return &w.ClientConfig }, base, caPEM)
			n += len(c.Webhooks)
			err = apply(func() error {
				_, err := api.MutatingWebhookConfigurations().Create(ctx, c, metav1.CreateOptions{})
				return err
			},
				func() error { return api.MutatingWebhookConfigurations().Delete(ctx, c.Name, metav1.DeleteOptions{}) })
		case "ValidatingWebhookConfiguration":
			c := &admissionv1.ValidatingWebhookConfiguration{}
			if err := yaml.UnmarshalStrict(raw, c); err != nil {
				return n, fmt.Errorf("kueue: %s: %w", f, err)
			}
			c.Name, c.Webhooks = "kueue-"+c.Name, keep(c.Webhooks, func(w *admissionv1.ValidatingWebhook) *admissionv1.WebhookClientConfig { return &w.ClientConfig }, base, caPEM)
			n += len(c.Webhooks)
			err = apply(func() error {
				_, err := api.ValidatingWebhookConfigurations().Create(ctx, c, metav1.CreateOptions{})
				return err
			},
				func() error { return api.ValidatingWebhookConfigurations().Delete(ctx, c.Name, metav1.DeleteOptions{}) })
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// keep is the wanted webhooks of ws, each calling base and its Service's
// path, trusting caPEM.
func keep[W any](ws []W, config func(*W) *admissionv1.WebhookClientConfig, base string, caPEM []byte) []W {
	var out []W
	for i := range ws {
		cc := config(&ws[i])
		if cc.Service == nil || cc.Service.Path == nil || !wanted(*cc.Service.Path) {
			continue
		}
		u := base + *cc.Service.Path
		*cc = admissionv1.WebhookClientConfig{URL: &u, CABundle: caPEM}
		out = append(out, ws[i])
	}
	return out
}

// apply creates an object, replacing one of a Kueue started before on
// the same API server.
func apply(create, del func() error) error {
	err := create()
	if apierrors.IsAlreadyExists(err) {
		if err = del(); err == nil {
			err = create()
		}
	}
	if err != nil {
		return fmt.Errorf("kueue: webhook configuration: %w", err)
	}
	return nil
}
