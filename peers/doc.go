// Package peers exchanges booked load between kvroute replicas.
//
// Each replica books only the requests it routed (scoring.Bookings), so two replicas in
// front of one fleet each see half of every worker's queue, and both send the next
// request to the worker the other just filled. Replay measured what that costs and what
// a periodic exchange of per-worker counts buys back (docs/BENCHMARKS.md, "Several
// replicas and stale signals"). This package is that exchange:
//
//   - every replica serves its own booked load per worker on its admin port
//     ([Handler], GET [Path]), as a [Report], or with ?watch as a stream: a report
//     within [Config.Interval] of each change, and a heartbeat every [Heartbeat];
//   - every replica watches its peers' streams ([Exchange]), sums the latest report of
//     each replica heard from within [Config.StaleAfter], and hands the sums that
//     changed to its ledger (scoring.Bookings.SetPeerLoad), which adds them to its own
//     P, N and W when it scores;
//   - each report also carries every worker's prefill history H (prefill_history_weight)
//     as of the report, with the half-life it decays with: a watcher takes it as of the
//     line's age before it read it, on its own clock (the replicas' clocks are never
//     compared), sums the replicas' histories decayed to the moment it hands them to
//     its ledger (scoring.Bookings.SetPeerHistory), which decays the sum from then on
//     with the half-life in force for each request and adds it to its own H. H decays
//     without a report: it is sent when the bookings change, with P, N and W.
//
// Peers are found from a static list of admin addresses, or from a DNS name whose every
// address is a replica (a Kubernetes headless Service), or both. A replica recognises
// itself among them by its replica id and skips that address. Distinct active blocks
// (D) are not exchanged: blocks two replicas both have active do not sum.
//
// Reports come from other processes: they are parsed with bounds on size, workers and
// counts ([ParseReport]), and a peer whose report is refused or late counts as silent.
package peers
