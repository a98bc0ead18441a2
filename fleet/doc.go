// Package fleet applies a change of the worker set, from a config reload or a discovery
// source, to every part of kvroute that knows workers: the index, the health probes and
// metric scrapes, and the router's candidate list, in the order that keeps decisions
// valid while it happens.
package fleet
