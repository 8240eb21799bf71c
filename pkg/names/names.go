// Package names derives run IDs and the names of the Kubernetes objects of a
// run. Every name is deterministic, so a redelivered event finds the objects
// an earlier delivery created instead of making new ones.
package names

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
)

// Label and annotation keys raydrop puts on every object it creates.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "raydrop"
	LabelRunID     = "raydrop.dev/run-id"
	LabelAttempt   = "raydrop.dev/attempt"
	LabelSpecName  = "raydrop.dev/spec-name"
	LabelComponent = "raydrop.dev/component"
	AnnotSpecHash  = "raydrop.dev/spec-hash"
	AnnotSource    = "raydrop.dev/source"
	AnnotCodeHash  = "raydrop.dev/trainer-hash"
	MaxRunIDLength = 40
	maxBaseLength  = 20
	hashLength     = 12
)

// RunIDFromObject is the run ID of a spec object: a re-upload (a new
// generation) is a new run, a duplicate event of the same generation is the
// same run.
func RunIDFromObject(bucket, object string, generation int64) string {
	base := sanitize(strings.TrimSuffix(path.Base(object), path.Ext(object)))
	return withHash(base, fmt.Sprintf("gs://%s/%s#%d", bucket, object, generation))
}

// RunIDFromMessage is the run ID of a request published without a runId: the
// message ID, which Pub/Sub keeps across redeliveries.
func RunIDFromMessage(topic, messageID string) string {
	return withHash("msg", topic+"#"+messageID)
}

func withHash(base, key string) string {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])[:hashLength]
	if base == "" {
		base = "job"
	}
	return base + "-" + h
}

// sanitize maps s to lower-case letters, digits and single dashes, at most
// maxBaseLength long, starting with a letter.
func sanitize(s string) string {
	var b strings.Builder
	dash := false
loop:
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			if b.Len() == 0 && r >= '0' && r <= '9' {
				b.WriteString("j")
			}
			b.WriteRune(r)
			dash = false
		case b.Len() > 0 && !dash:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= maxBaseLength {
			break loop
		}
	}
	out := b.String()
	if len(out) > maxBaseLength {
		out = out[:maxBaseLength]
	}
	return strings.TrimRight(out, "-")
}

// SpecName is a label-safe job name taken from an object name, for specs
// that do not name themselves.
func SpecName(object string) string {
	if s := sanitize(strings.TrimSuffix(path.Base(object), path.Ext(object))); s != "" {
		return s
	}
	return "job"
}

// RayJob is the name of a run's RayJob for one attempt (1-based). It stays
// within KubeRay's 47-character limit for any valid run ID.
func RayJob(runID string, attempt int) string {
	return fmt.Sprintf("%s-%d", runID, attempt)
}

// SubmissionID is the Ray job submission ID of an attempt, so the Ray job
// is found again by name and never submitted twice.
func SubmissionID(runID string, attempt int) string {
	return "raydrop-" + RayJob(runID, attempt)
}

// TrainerConfigMap is the name of the ConfigMap that carries trainer code
// whose content hash is codeHash.
func TrainerConfigMap(codeHash string) string {
	return "raydrop-trainer-" + codeHash[:10]
}

// RunIDFromFile is the run ID used when a spec file is rendered locally:
// the same file content gives the same ID.
func RunIDFromFile(file string, content []byte) string {
	sum := sha256.Sum256(content)
	return withHash(sanitize(strings.TrimSuffix(path.Base(file), path.Ext(file))), "file#"+hex.EncodeToString(sum[:]))
}

// NoticePrefix is where the trainer announces its completion mark: one small
// object per attempt, raydrop-marks/<run ID>/attempt-<n>.json, at the root
// of the checkpoint bucket. The bucket's notification is filtered to this
// prefix, so the mark wakes Monitor and no checkpoint file does.
const NoticePrefix = "raydrop-marks/"

// The labels KubeRay gives a RayCluster's pods (utils.RayClusterLabelKey
// and utils.RayNodeTypeLabelKey in ray-operator/controllers/ray/utils).
const (
	LabelRayCluster  = "ray.io/cluster"
	LabelRayNodeType = "ray.io/node-type"
)

// The GKE node labels a worker pod's node selector uses to pick its
// capacity tier (manifests.WorkerPlacement); the local cloud reads the
// same labels to play a tier's availability.
const (
	NodeAccelerator         = "cloud.google.com/gke-accelerator"
	NodeReservation         = "cloud.google.com/reservation-name"
	NodeReservationAffinity = "cloud.google.com/reservation-affinity"
	NodeReservationProject  = "cloud.google.com/reservation-project"
	NodeFlexStart           = "cloud.google.com/gke-flex-start"
	NodeSpot                = "cloud.google.com/gke-spot"
)

// MarkNotice is the object name of an attempt's mark notice.
func MarkNotice(runID string, attempt int) string {
	return fmt.Sprintf("%s%s/attempt-%d.json", NoticePrefix, runID, attempt)
}

// RunOfNotice is the run ID a mark notice names.
func RunOfNotice(object string) (string, bool) {
	rest, ok := strings.CutPrefix(object, NoticePrefix)
	if !ok {
		return "", false
	}
	runID, file, ok := strings.Cut(rest, "/")
	var n int
	if !ok || runID == "" || strings.Contains(file, "/") {
		return "", false
	}
	if _, err := fmt.Sscanf(file, "attempt-%d.json", &n); err != nil || n < 1 || file != fmt.Sprintf("attempt-%d.json", n) {
		return "", false
	}
	return runID, true
}
