// Package localcloud runs raydrop's whole pipeline on one machine.
//
//   - emulators: the Pub/Sub emulator and fake-gcs-server as processes
//   - kubesim: kube-apiserver + etcd with KubeRay's reconcilers and the
//     kubelet, Job controller and Ray job simulators
//   - eventarc: Pub/Sub messages (pulled, or pushed) turned into the CloudEvents Eventarc sends
//   - faults: the recording, fault-injecting proxy between the functions and
//     the services
//   - strictgcs: the gate that holds fake-gcs-server to Cloud Storage's
//     preconditions and metagenerations, for every client
//   - stack: all of it together with the four functions as processes
//   - probe: watching a stack from outside (uploads, records, events, RayJobs)
//   - proof: the reliability and security suite (make proof)
//   - cmd/localcloud: make run and make dev
//   - cmd/bench, cmd/minimalfn: the control-plane benchmark (make bench)
package localcloud
