package kvevents

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// maxReadyBytes caps the peer's READY command, which a limited connection holds until
// it has checked it: a socket type and an identity take under 300 bytes.
const maxReadyBytes = 64 << 10

// errBadReady is what a limited connection's Read returns for a READY that zmq4 would
// panic on (or any first message that is not a single READY command): the handshake
// fails and the connection is closed.
type errBadReady string

func (e errBadReady) Error() string { return "kvevents: ZMTP handshake refused: " + string(e) }

// checkReady checks a READY command's body (name length, name, properties) before zmq4
// reads it. zmq4 panics, taking kvroute down, on a peer's READY whose properties
// overrun the command (Property.Write slices past the end), and on a socket type it
// does not know, a missing one included (SocketType.IsCompatible has no case for it).
// The check is zmq4's parse without the panics: properties of a one-byte name length,
// the name, a four-byte big-endian value length and the value, filling the command
// exactly; names title-cased as zmq4 does (cases.Title, no lowering), the last one of a
// name winning; the socket types are those zmq4 knows.
func checkReady(cmd []byte) error {
	if len(cmd) == 0 || int(cmd[0]) > len(cmd)-1 || string(cmd[1:1+int(cmd[0])]) != "READY" {
		return errBadReady("the peer's first command is not READY")
	}
	props := cmd[1+int(cmd[0]):]
	title := cases.Title(language.Und, cases.NoLower)
	socketType := ""
	for len(props) > 0 {
		k := int(props[0])
		if len(props) < 1+k+4 {
			return errBadReady("a READY property cut short")
		}
		name := string(props[1 : 1+k])
		v := binary.BigEndian.Uint32(props[1+k:])
		props = props[1+k+4:]
		if uint64(v) > uint64(len(props)) {
			return errBadReady("a READY property value cut short")
		}
		if title.String(name) == "Socket-Type" {
			socketType = string(props[:v])
		}
		props = props[v:]
	}
	switch socketType {
	case "PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB", "XSUB":
		return nil
	}
	return errBadReady(fmt.Sprintf("unknown socket type %q", socketType))
}
