package gcp

import (
	"encoding/base64"
	"strings"
	"testing"

	"cloud.google.com/go/container/apiv1/containerpb"
)

// TestGKEEndpoint: the DNS-based endpoint when it is open to traffic from
// outside the VPC, else the public IP endpoint with the cluster's CA, else
// an error that says how to open the DNS-based endpoint.
func TestGKEEndpoint(t *testing.T) {
	ca := base64.StdEncoding.EncodeToString([]byte("CA"))
	dns := func(allow bool) *containerpb.ControlPlaneEndpointsConfig_DNSEndpointConfig {
		return &containerpb.ControlPlaneEndpointsConfig_DNSEndpointConfig{Endpoint: "gke-1.us-central1.gke.goog", AllowExternalTraffic: &allow}
	}
	ip := func(enabled, public bool) *containerpb.ControlPlaneEndpointsConfig_IPEndpointsConfig {
		return &containerpb.ControlPlaneEndpointsConfig_IPEndpointsConfig{Enabled: &enabled, EnablePublicEndpoint: &public}
	}
	cluster := func(d *containerpb.ControlPlaneEndpointsConfig_DNSEndpointConfig, i *containerpb.ControlPlaneEndpointsConfig_IPEndpointsConfig) *containerpb.Cluster {
		c := &containerpb.Cluster{Name: "raydrop", Location: "us-central1", Endpoint: "34.1.2.3", MasterAuth: &containerpb.MasterAuth{ClusterCaCertificate: ca}}
		if d != nil || i != nil {
			c.ControlPlaneEndpointsConfig = &containerpb.ControlPlaneEndpointsConfig{DnsEndpointConfig: d, IpEndpointsConfig: i}
		}
		return c
	}
	for _, c := range []struct {
		name    string
		cluster *containerpb.Cluster
		host    string
		withCA  bool
		err     string
	}{
		{"dns open", cluster(dns(true), ip(true, true)), "https://gke-1.us-central1.gke.goog", false, ""},
		{"dns open, private ip", cluster(dns(true), ip(true, false)), "https://gke-1.us-central1.gke.goog", false, ""},
		{"dns open, no ip", cluster(dns(true), ip(false, false)), "https://gke-1.us-central1.gke.goog", false, ""},
		{"dns closed, public ip", cluster(dns(false), ip(true, true)), "https://34.1.2.3", true, ""},
		{"no endpoints config (older cluster)", cluster(nil, nil), "https://34.1.2.3", true, ""},
		{"dns closed, private ip", cluster(dns(false), ip(true, false)), "", false, "--enable-dns-access"},
		{"ip endpoints with unset fields (the API's defaults)", cluster(dns(false), &containerpb.ControlPlaneEndpointsConfig_IPEndpointsConfig{}), "https://34.1.2.3", true, ""},
		{"no ip endpoint, dns closed", cluster(dns(false), ip(false, false)), "", false, "--enable-dns-access"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ep, err := GKEEndpoint(c.cluster)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one with %q", err, c.err)
				}
				return
			}
			if err != nil || ep.Host != c.host || (ep.CA != nil) != c.withCA {
				t.Errorf("endpoint %+v err %v, want %s with CA %v", ep, err, c.host, c.withCA)
			}
		})
	}
}
