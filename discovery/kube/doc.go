// Package kube is worker discovery from a Gateway API Inference Extension InferencePool
// (inference.networking.k8s.io/v1): the pool's selector picks pods, its targetPorts
// pick ports, and each (pod, port) of a pod that is Running, Ready and has an IP is a
// worker, named after the pod (`<pod>:<port>` when the pool lists several ports) at
// `podIP:port`. It is the only package that imports client-go: the pool is read
// through the dynamic client into kvroute's own [InferencePool] type (the GIE API
// module is not served by the Go module proxy), the pods through a shared informer.
//
// A [Source] is a discovery.Source; run it under a discovery.Runner, which applies its
// sets to the fleet. Pods that leave, stop being ready or change IP drop out of the
// next set, and the fleet removes them as a config reload does.
package kube
