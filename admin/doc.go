// Package admin is kvroute's admin HTTP port: metrics, liveness and readiness, the
// runtime policy API, config reload and, when enabled, profiling. Reads are open to
// whoever reaches the port; changes (anything but GET and HEAD) are accepted only from
// loopback unless remote changes are allowed, because the port is often reachable for
// scraping, and scraping must not grant control of routing.
//
//	GET  /metrics            Prometheus
//	GET  /healthz            liveness: 200 while the process serves
//	GET  /readyz             readiness: 200 once ready, 503 before and while draining
//	GET|PUT|PATCH /policy    the runtime policy API (package policyapi)
//	POST /reload             re-read the config file
//	GET  /decisions?limit=N  the last sampled decisions (package explain)
//	GET  /peers/load         this replica's booked load, for the others (package peers)
//	GET  /peers              the other replicas as this one hears them (package peers)
//	GET  /workers            the fleet as the router sees it
//	GET  /debug/pprof/…      profiles, only with Config.Pprof
//
// Every request with a body has 10 s to send it and every answer but a profile 2
// minutes to be written (Handler), so a client that stalls holds no connection or
// handler for good; a watch of /peers/load bounds each of its writes itself.
package admin
