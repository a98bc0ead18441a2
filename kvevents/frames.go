package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// ErrFrames wraps every error of a ZMQ message whose frames are not a KV events message.
var ErrFrames = errors.New("kvevents: bad frames")

// endSeq is the sequence number of the replay end marker: all bits set (vLLM sends -1
// as 8 bytes big-endian).
const endSeq = ^uint64(0)

// Message is one live message: `[topic, seq, payload]`.
type Message struct {
	Topic   []byte
	Seq     uint64
	Payload []byte
}

// ParseMessage reads a live message's three frames: the topic, the 8-byte big-endian
// sequence number (it counts batches per publisher process from 0) and the payload.
// The result aliases frames.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("%w: %d frames, want topic, seq, payload", ErrFrames, len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("%w: seq frame of %d bytes, want 8", ErrFrames, len(frames[1]))
	}
	return Message{Topic: frames[0], Seq: binary.BigEndian.Uint64(frames[1]), Payload: frames[2]}, nil
}

// MessageFrames is the inverse of ParseMessage.
func MessageFrames(topic string, seq uint64, payload []byte) [][]byte {
	return [][]byte{[]byte(topic), binary.BigEndian.AppendUint64(nil, seq), payload}
}

// ReplayRequest is what a DEALER sends a publisher's ROUTER replay socket: an empty
// delimiter and the first sequence number wanted, 8 bytes big-endian.
func ReplayRequest(start uint64) [][]byte {
	return [][]byte{{}, binary.BigEndian.AppendUint64(nil, start)}
}

// ParseReplayRequest reads a replay request as a ROUTER socket receives it: the
// client's identity, the empty delimiter and the start sequence number.
func ParseReplayRequest(frames [][]byte) (identity []byte, start uint64, err error) {
	if len(frames) != 3 || len(frames[1]) != 0 || len(frames[2]) != 8 {
		return nil, 0, fmt.Errorf("%w: replay request of %d frames, want identity, empty, seq", ErrFrames, len(frames))
	}
	return frames[0], binary.BigEndian.Uint64(frames[2]), nil
}

// ReplayLayout is the shape of a publisher's replay replies.
type ReplayLayout uint8

const (
	// ReplayWithoutTopic: `["", seq, payload]` (vLLM < 0.26, SGLang).
	ReplayWithoutTopic ReplayLayout = iota
	// ReplayWithTopic: `["", topic, seq, payload]` (vLLM ≥ 0.26).
	ReplayWithTopic
)

// ReplayFrames is one replay reply as a DEALER receives it, in the given layout; the
// end marker is ReplayFrames(layout, topic, endSeq, nil).
func ReplayFrames(layout ReplayLayout, topic string, seq uint64, payload []byte) [][]byte {
	s := binary.BigEndian.AppendUint64(nil, seq)
	if layout == ReplayWithTopic {
		return [][]byte{{}, []byte(topic), s, payload}
	}
	return [][]byte{{}, s, payload}
}

// ReplayEnd is the end marker's frames in the given layout.
func ReplayEnd(layout ReplayLayout, topic string) [][]byte {
	return ReplayFrames(layout, topic, endSeq, []byte{})
}

// ParseReplay reads one replay reply, in either layout (told apart by the frame count).
// end is set for the end marker (seq all 0xFF, empty payload).
func ParseReplay(frames [][]byte) (m Message, end bool, err error) {
	switch len(frames) {
	case 3:
		m = Message{Payload: frames[2]}
		frames = frames[:2]
	case 4:
		m = Message{Topic: frames[1], Payload: frames[3]}
		frames = [][]byte{frames[0], frames[2]}
	default:
		return Message{}, false, fmt.Errorf("%w: replay reply of %d frames, want 3 or 4", ErrFrames, len(frames))
	}
	if len(frames[0]) != 0 {
		return Message{}, false, fmt.Errorf("%w: replay reply without its empty delimiter", ErrFrames)
	}
	if len(frames[1]) != 8 {
		return Message{}, false, fmt.Errorf("%w: replay seq frame of %d bytes, want 8", ErrFrames, len(frames[1]))
	}
	m.Seq = binary.BigEndian.Uint64(frames[1])
	if m.Seq == endSeq {
		return m, true, nil
	}
	return m, false, nil
}
