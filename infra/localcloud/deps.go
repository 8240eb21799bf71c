package localcloud

// The packages of this module, imported here so go mod tidy keeps their
// dependencies while the module is assembled.
import (
	_ "cloud.google.com/go/pubsub/v2"
	_ "cloud.google.com/go/storage"
	_ "github.com/ray-project/kuberay/ray-operator/controllers/ray"
	_ "github.com/raydrop/raydrop/pkg/kubetest"
	_ "sigs.k8s.io/controller-runtime"
)
