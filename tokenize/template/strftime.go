package template

import (
	"strconv"
	"strings"
	"time"
)

// strftime formats t as Python's datetime.strftime does on Linux (glibc, C locale):
// the directives chat templates use, glibc's "-" flag for no padding, and any unknown
// directive written out as is.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		start := i
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) {
			noPad = true
			i++
		}
		if !writeDirective(&b, t, format[i], noPad) {
			b.WriteString(format[start : i+1])
		}
	}
	return b.String()
}

// writeDirective writes one directive and reports whether it knows it.
func writeDirective(b *strings.Builder, t time.Time, d byte, noPad bool) bool {
	num := func(n, width int, pad byte) {
		s := strconv.Itoa(n)
		if !noPad {
			for k := len(s); k < width; k++ {
				b.WriteByte(pad)
			}
		}
		b.WriteString(s)
	}
	hour12 := t.Hour() % 12
	if hour12 == 0 {
		hour12 = 12
	}
	switch d {
	case '%':
		b.WriteByte('%')
	case 'a':
		b.WriteString(t.Weekday().String()[:3])
	case 'A':
		b.WriteString(t.Weekday().String())
	case 'b', 'h':
		b.WriteString(t.Month().String()[:3])
	case 'B':
		b.WriteString(t.Month().String())
	case 'c':
		b.WriteString(strftime(t, "%a %b %e %H:%M:%S %Y"))
	case 'C':
		num(t.Year()/100, 2, '0')
	case 'd':
		num(t.Day(), 2, '0')
	case 'D':
		b.WriteString(strftime(t, "%m/%d/%y"))
	case 'e':
		num(t.Day(), 2, ' ')
	case 'F':
		b.WriteString(strftime(t, "%Y-%m-%d"))
	case 'G':
		y, _ := t.ISOWeek()
		num(y, 4, '0')
	case 'H':
		num(t.Hour(), 2, '0')
	case 'I':
		num(hour12, 2, '0')
	case 'j':
		num(t.YearDay(), 3, '0')
	case 'k':
		num(t.Hour(), 2, ' ')
	case 'l':
		num(hour12, 2, ' ')
	case 'm':
		num(int(t.Month()), 2, '0')
	case 'M':
		num(t.Minute(), 2, '0')
	case 'n':
		b.WriteByte('\n')
	case 'p':
		if t.Hour() < 12 {
			b.WriteString("AM")
		} else {
			b.WriteString("PM")
		}
	case 'R':
		b.WriteString(strftime(t, "%H:%M"))
	case 's':
		b.WriteString(strconv.FormatInt(t.Unix(), 10))
	case 'S':
		num(t.Second(), 2, '0')
	case 't':
		b.WriteByte('\t')
	case 'T', 'X':
		b.WriteString(strftime(t, "%H:%M:%S"))
	case 'u':
		num((int(t.Weekday())+6)%7+1, 1, '0')
	case 'U':
		num((t.YearDay()+6-int(t.Weekday()))/7, 2, '0')
	case 'V':
		_, w := t.ISOWeek()
		num(w, 2, '0')
	case 'w':
		num(int(t.Weekday()), 1, '0')
	case 'W':
		num((t.YearDay()+6-(int(t.Weekday())+6)%7)/7, 2, '0')
	case 'x':
		b.WriteString(strftime(t, "%m/%d/%y"))
	case 'y':
		num(t.Year()%100, 2, '0')
	case 'Y':
		num(t.Year(), 1, '0')
	case 'z':
		b.WriteString(t.Format("-0700"))
	case 'Z':
		name, _ := t.Zone()
		b.WriteString(name)
	default:
		return false
	}
	return true
}
