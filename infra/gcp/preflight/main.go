// Command preflight checks, before make deploy applies infra/gcp, what a
// fresh project most often lacks and no plan can see: the region's GPU
// quota for the capacity tiers the job specs will use, and, for
// flex-start, the GKE version. It asks gcloud (which make deploy needs
// anyway) and reads its JSON.
//
// Which quota a tier draws on:
//   - reservation, onDemand: the regular GPU quota (NVIDIA_B200_GPUS for
//     B200); a reservation's GPUs were counted against it when the
//     reservation was made, so for that tier only the limit is checked;
//   - flexStart, spot: the preemptible GPU quota
//     (PREEMPTIBLE_NVIDIA_B200_GPUS), which must have room for the GPUs.
//
// https://cloud.google.com/compute/resource-usage#gpu_quota,
// https://cloud.google.com/compute/docs/instances/create-use-spot,
// https://cloud.google.com/kubernetes-engine/docs/concepts/dws,
// https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/raydrop/raydrop/pkg/spec"
)

// The capacity tiers of a job spec's cluster.capacity, as pkg/spec names
// them.
const (
	tierReservation = spec.TierReservation
	tierFlexStart   = spec.TierFlexStart
	tierSpot        = spec.TierSpot
	tierOnDemand    = spec.TierOnDemand
)

// minFlexStartVersion is the oldest GKE version the check accepts for
// flex-start on Autopilot.
const minFlexStartVersion = "1.33.0-gke.1712000"

// quotaMetrics are the Compute Engine quota metrics of accelerators whose
// metric is not simply the upper-cased accelerator name plus _GPUS.
var quotaMetrics = map[string]string{
	"nvidia-b200":       "NVIDIA_B200_GPUS",
	"nvidia-h200-141gb": "NVIDIA_H200_GPUS",
	"nvidia-h100-80gb":  "NVIDIA_H100_GPUS",
}

type config struct {
	region      string
	accelerator string
	gpus        float64
	tiers       []string
	cluster     string // an existing cluster, checked instead of a new one's version
	location    string
	minVersion  string
}

// gcloud runs gcloud with args and returns its standard output.
type gcloud func(args ...string) ([]byte, error)

func main() {
	var c config
	var tiers, tfvars, specs string
	flag.StringVar(&c.region, "region", "", "region of the deployment (default: region in -tfvars, else us-central1)")
	flag.StringVar(&tfvars, "tfvars", "", "the deployment's terraform.tfvars, read for its region")
	flag.StringVar(&c.accelerator, "accelerator", "nvidia-b200", "the workers' accelerator (a job spec's cluster.workers.accelerator)")
	flag.Float64Var(&c.gpus, "gpus", 16, "GPUs one run needs (workers × GPUs per worker)")
	flag.StringVar(&tiers, "tiers", tierReservation, "comma-separated capacity tiers the job specs list: "+strings.Join(spec.TierTypes, ", "))
	flag.StringVar(&c.cluster, "cluster", "", "an existing cluster's name (create_cluster = false)")
	flag.StringVar(&c.location, "location", "", "the existing cluster's location")
	flag.StringVar(&c.minVersion, "min-flex-version", minFlexStartVersion, "the oldest GKE version accepted for flex-start")
	flag.StringVar(&specs, "specs", "", "comma-separated job spec files: their tiers, accelerator and GPUs replace -tiers, -accelerator and -gpus")
	flag.Parse()
	c.tiers = strings.Split(tiers, ",")
	if specs != "" {
		var err error
		if c, err = fromSpecs(c, strings.Split(specs, ",")); err != nil {
			fmt.Fprintf(os.Stderr, "preflight: %v\n", err)
			os.Exit(1)
		}
	}
	if c.region == "" {
		c.region = regionOf(tfvars)
	}
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command("gcloud", args...)
		cmd.Stderr = os.Stderr
		return cmd.Output()
	}
	if err := check(c, run, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "preflight: %v\npreflight: skip the check with make deploy PREFLIGHT=0\n", err)
		os.Exit(1)
	}
}

// fromSpecs is c checking for the job specs in paths: every capacity tier
// they list, their accelerator, and the most GPUs one of them needs (its
// Ray Train workers, one per GPU). Specs of different accelerators are
// checked by one run each.
func fromSpecs(c config, paths []string) (config, error) {
	c.tiers, c.accelerator, c.gpus = nil, "", 0
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return c, err
		}
		s, err := spec.Parse(b)
		if err != nil {
			return c, fmt.Errorf("%s: %w", p, err)
		}
		if a := s.Cluster.Workers.Accelerator; c.accelerator == "" {
			c.accelerator = a
		} else if a != c.accelerator {
			return c, fmt.Errorf("%s asks for %s, another spec for %s: check each accelerator's specs with a run of their own", p, a, c.accelerator)
		}
		c.gpus = max(c.gpus, float64(s.Training.Workers))
		for _, t := range s.Tiers() {
			if !slices.Contains(c.tiers, t.Type) {
				c.tiers = append(c.tiers, t.Type)
			}
		}
	}
	return c, nil
}

var regionLine = regexp.MustCompile(`(?m)^\s*region\s*=\s*"([^"]+)"`)

// regionOf is the region a tfvars file sets, else the variable's default.
func regionOf(tfvars string) string {
	if b, err := os.ReadFile(tfvars); err == nil {
		if m := regionLine.FindSubmatch(b); m != nil {
			return string(m[1])
		}
	}
	return "us-central1"
}

// check runs every check and reports every problem together.
func check(c config, run gcloud, out io.Writer) error {
	var errs []error
	for _, t := range c.tiers {
		if !slices.Contains(spec.TierTypes, t) {
			errs = append(errs, fmt.Errorf("unknown capacity tier %q (allowed: %s)", t, strings.Join(spec.TierTypes, ", ")))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	raw, err := run("compute", "regions", "describe", c.region, "--format=json")
	if err != nil {
		return fmt.Errorf("gcloud compute regions describe %s: %w", c.region, err)
	}
	quotas, err := parseQuotas(raw)
	if err != nil {
		return err
	}
	for _, p := range quotaProblems(quotas, c) {
		errs = append(errs, errors.New(p))
	}
	if slices.Contains(c.tiers, tierFlexStart) {
		v, err := clusterVersion(c, run)
		if err != nil {
			errs = append(errs, err)
		} else if ok, err := versionAtLeast(v, c.minVersion); err != nil {
			errs = append(errs, err)
		} else if !ok {
			errs = append(errs, fmt.Errorf("flex-start on Autopilot needs GKE %s or later; the cluster runs (or a new REGULAR-channel cluster gets) %s", c.minVersion, v))
		} else {
			fmt.Fprintf(out, "preflight: GKE %s is at least %s (flex-start)\n", v, c.minVersion)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	fmt.Fprintf(out, "preflight: %s has the GPU quota for %g %s on %s\n", c.region, c.gpus, c.accelerator, strings.Join(c.tiers, ", "))
	return nil
}

// quota is one entry of a Compute Engine region's quotas
// (https://cloud.google.com/compute/docs/reference/rest/v1/regions).
type quota struct {
	Metric string  `json:"metric"`
	Limit  float64 `json:"limit"`
	Usage  float64 `json:"usage"`
}

func parseQuotas(raw []byte) (map[string]quota, error) {
	var region struct {
		Name   string  `json:"name"`
		Quotas []quota `json:"quotas"`
	}
	if err := json.Unmarshal(raw, &region); err != nil {
		return nil, fmt.Errorf("read the region's quotas: %w", err)
	}
	if len(region.Quotas) == 0 {
		return nil, fmt.Errorf("region %q lists no quotas", region.Name)
	}
	m := make(map[string]quota, len(region.Quotas))
	for _, q := range region.Quotas {
		m[q.Metric] = q
	}
	return m, nil
}

// quotaMetric is the regular quota metric of an accelerator.
func quotaMetric(accelerator string) string {
	if m, ok := quotaMetrics[accelerator]; ok {
		return m
	}
	return strings.ToUpper(strings.ReplaceAll(accelerator, "-", "_")) + "_GPUS"
}

// quotaProblems lists what the quotas lack for the tiers.
func quotaProblems(quotas map[string]quota, c config) []string {
	var problems []string
	regular := quotaMetric(c.accelerator)
	seen := map[string]bool{}
	for _, t := range c.tiers {
		metric, headroom := regular, true
		switch t {
		case tierReservation:
			headroom = false // the reservation's GPUs are already in the usage
		case tierFlexStart, tierSpot:
			metric = "PREEMPTIBLE_" + regular
		}
		key := metric + strconv.FormatBool(headroom)
		if seen[key] {
			continue
		}
		seen[key] = true
		q, ok := quotas[metric]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s: the region has no %s quota (tier %s); request it: https://cloud.google.com/compute/resource-usage#gpu_quota", c.region, metric, t))
		case q.Limit < c.gpus:
			problems = append(problems, fmt.Sprintf("%s: %s quota is %g, a run needs %g (tier %s); request more: https://cloud.google.com/compute/resource-usage#gpu_quota", c.region, metric, q.Limit, c.gpus, t))
		case headroom && q.Limit-q.Usage < c.gpus:
			problems = append(problems, fmt.Sprintf("%s: %s has %g of %g free, a run needs %g (tier %s)", c.region, metric, q.Limit-q.Usage, q.Limit, c.gpus, t))
		}
	}
	return problems
}

// clusterVersion is the existing cluster's control-plane version, or the
// version a new cluster on the REGULAR channel (gke.tf) gets in the region.
func clusterVersion(c config, run gcloud) (string, error) {
	if c.cluster != "" {
		raw, err := run("container", "clusters", "describe", c.cluster, "--location", c.location, "--format=json")
		if err != nil {
			return "", fmt.Errorf("gcloud container clusters describe %s: %w", c.cluster, err)
		}
		var cl struct {
			CurrentMasterVersion string `json:"currentMasterVersion"`
		}
		if err := json.Unmarshal(raw, &cl); err != nil {
			return "", fmt.Errorf("read cluster %s: %w", c.cluster, err)
		}
		if cl.CurrentMasterVersion == "" {
			return "", fmt.Errorf("cluster %s reports no currentMasterVersion", c.cluster)
		}
		return cl.CurrentMasterVersion, nil
	}
	raw, err := run("container", "get-server-config", "--location", c.region, "--format=json")
	if err != nil {
		return "", fmt.Errorf("gcloud container get-server-config: %w", err)
	}
	return regularDefault(raw)
}

// regularDefault reads the REGULAR channel's default version from
// get-server-config's JSON (a ServerConfig:
// https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/ServerConfig).
func regularDefault(raw []byte) (string, error) {
	var sc struct {
		Channels []struct {
			Channel        string `json:"channel"`
			DefaultVersion string `json:"defaultVersion"`
		} `json:"channels"`
	}
	if err := json.Unmarshal(raw, &sc); err != nil {
		return "", fmt.Errorf("read the server config: %w", err)
	}
	for _, ch := range sc.Channels {
		if ch.Channel == "REGULAR" && ch.DefaultVersion != "" {
			return ch.DefaultVersion, nil
		}
	}
	return "", errors.New("the server config has no REGULAR channel default")
}

var gkeVersion = regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)-gke\.(\d+)$`)

// versionAtLeast compares GKE versions (1.33.0-gke.1712000).
func versionAtLeast(v, min string) (bool, error) {
	parse := func(s string) ([4]int, error) {
		m := gkeVersion.FindStringSubmatch(s)
		if m == nil {
			return [4]int{}, fmt.Errorf("%q is not a GKE version (1.33.0-gke.1712000)", s)
		}
		var n [4]int
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		return n, nil
	}
	a, err := parse(v)
	if err != nil {
		return false, err
	}
	b, err := parse(min)
	if err != nil {
		return false, err
	}
	return slices.Compare(a[:], b[:]) >= 0, nil
}
