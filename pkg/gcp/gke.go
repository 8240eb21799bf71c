package gcp

import (
	"encoding/base64"
	"errors"
	"fmt"

	"cloud.google.com/go/container/apiv1/containerpb"
)

// Endpoint is where a function reaches a GKE cluster's control plane.
type Endpoint struct {
	Host string // https://<name or address>
	// CA is the cluster's own CA for an IP endpoint; nil for the DNS-based
	// endpoint, whose certificate is publicly trusted.
	CA []byte
}

// GKEEndpoint picks the control-plane endpoint of c that a Cloud Run
// function reaches without a VPC connector:
//
//  1. the DNS-based endpoint, when it accepts traffic from outside the
//     cluster's VPC: every request is checked by IAM
//     (container.clusters.connect, in roles/container.clusterViewer), it
//     works for clusters whose IP endpoints are private, and its name
//     survives control-plane IP and CA changes
//     (https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation#dns-based-endpoint);
//  2. else the public IP endpoint, verified against the cluster's CA.
//
// A cluster with neither (only a private IP endpoint) is an error that
// says how to enable the DNS-based endpoint.
func GKEEndpoint(c *containerpb.Cluster) (Endpoint, error) {
	eps := c.GetControlPlaneEndpointsConfig()
	if dns := eps.GetDnsEndpointConfig(); dns.GetEndpoint() != "" && dns.GetAllowExternalTraffic() {
		return Endpoint{Host: "https://" + dns.GetEndpoint()}, nil
	}
	// The API reports IP endpoints in ControlPlaneEndpointsConfig (its
	// PrivateClusterConfig.enable_private_endpoint is deprecated for it);
	// a response without it has only the public endpoint.
	public := true
	if ip := eps.GetIpEndpointsConfig(); ip != nil {
		// An unset field is the API's default: IP endpoints on, public.
		public = (ip.Enabled == nil || ip.GetEnabled()) && (ip.EnablePublicEndpoint == nil || ip.GetEnablePublicEndpoint())
	}
	if !public || c.GetEndpoint() == "" {
		// Not ErrConfiguration: enabling the endpoint fixes it without a
		// new deployment, and the next event reads the cluster again.
		return Endpoint{}, fmt.Errorf("GKE cluster %s has no control-plane endpoint reachable from Cloud Run: enable its DNS-based endpoint with access from outside the VPC "+
			"(gcloud container clusters update %s --location %s --enable-dns-access)", c.GetName(), c.GetName(), c.GetLocation())
	}
	ca, err := base64.StdEncoding.DecodeString(c.GetMasterAuth().GetClusterCaCertificate())
	if err != nil || len(ca) == 0 {
		return Endpoint{}, fmt.Errorf("GKE cluster %s: no usable CA certificate for its IP endpoint: %w", c.GetName(), errors.Join(err, errors.New("empty or not base64")))
	}
	return Endpoint{Host: "https://" + c.GetEndpoint(), CA: ca}, nil
}
