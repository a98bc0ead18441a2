package models

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/tokenize/hf"
	"github.com/kvroute/kvroute/tokenize/template"
)

// NewMetrics registers the segment memo counters of every in-process exact tokenizer
// of s, read at scrape time: kvroute_tokenize_memo_hits_total,
// kvroute_tokenize_memo_misses_total, kvroute_tokenize_memo_bytes and
// kvroute_tokenize_memo_entries, labelled by tokenizer (its source: builtin:NAME or the
// tokenizer.json path; bounded by the config), and its chat template's renders by way,
// kvroute_tokenize_chat_renders_total{tokenizer,renderer="direct"|"jinja"}. A nil reg
// registers nothing.
func NewMetrics(reg prometheus.Registerer, s *Set) {
	if reg == nil {
		return
	}
	reg.MustRegister(&memoCollector{set: s})
}

var (
	memoHits = prometheus.NewDesc("kvroute_tokenize_memo_hits_total",
		"Segment memo lookups answered from the memo (text between special tokens encoded before).", []string{"tokenizer"}, nil)
	memoMisses = prometheus.NewDesc("kvroute_tokenize_memo_misses_total",
		"Segment memo lookups that encoded the segment.", []string{"tokenizer"}, nil)
	memoBytes = prometheus.NewDesc("kvroute_tokenize_memo_bytes",
		"Bytes the segment memo accounts for (text, ids and a per-entry overhead); bounded by its limit.", []string{"tokenizer"}, nil)
	memoEntries = prometheus.NewDesc("kvroute_tokenize_memo_entries",
		"Segments held by the memo.", []string{"tokenizer"}, nil)
	chatRenders = prometheus.NewDesc("kvroute_tokenize_chat_renders_total",
		"Chats rendered with the tokenizer's chat template, by renderer: direct (Go written for that template, for the chats it takes) or jinja (the Jinja library).",
		[]string{"tokenizer", "renderer"}, nil)
)

// memoCollector reads each tokenizer's Stats once per scrape.
type memoCollector struct{ set *Set }

func (c *memoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{memoHits, memoMisses, memoBytes, memoEntries, chatRenders} {
		ch <- d
	}
}

func (c *memoCollector) Collect(ch chan<- prometheus.Metric) {
	for _, l := range c.set.locals {
		if l.exact {
			sendStats(ch, l.name, l.stats())
		}
		if r, ok := l.renderer.(*template.Renderer); ok {
			sendRenders(ch, l.name, r.Stats())
		}
	}
	if d := c.set.deferred; d != nil {
		// Zero until loaded: the series do not wait for a request to need it.
		var st hf.Stats
		var renders template.RenderStats
		if l := d.loaded.Load(); l != nil {
			st = l.stats()
			if r, ok := l.renderer.(*template.Renderer); ok {
				renders = r.Stats()
			}
		}
		sendStats(ch, d.name, st)
		sendRenders(ch, d.name, renders)
	}
}

func sendRenders(ch chan<- prometheus.Metric, tokenizer string, st template.RenderStats) {
	ch <- prometheus.MustNewConstMetric(chatRenders, prometheus.CounterValue, float64(st.Direct), tokenizer, "direct")
	ch <- prometheus.MustNewConstMetric(chatRenders, prometheus.CounterValue, float64(st.Library), tokenizer, "jinja")
}

func sendStats(ch chan<- prometheus.Metric, tokenizer string, st hf.Stats) {
	ch <- prometheus.MustNewConstMetric(memoHits, prometheus.CounterValue, float64(st.MemoHits), tokenizer)
	ch <- prometheus.MustNewConstMetric(memoMisses, prometheus.CounterValue, float64(st.MemoMisses), tokenizer)
	ch <- prometheus.MustNewConstMetric(memoBytes, prometheus.GaugeValue, float64(st.MemoBytes), tokenizer)
	ch <- prometheus.MustNewConstMetric(memoEntries, prometheus.GaugeValue, float64(st.MemoEntries), tokenizer)
}
