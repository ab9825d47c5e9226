/* Records the kernel side hands to otelbpf through the BPF ring buffer.
 *
 * otelbpf/sources/ebpf_layout.py mirrors these layouts with struct.Struct;
 * tests/test_ebpf_layout.py checks the two agree (compiled offsets vs Python).
 * Only fixed-width types, explicit padding: the layout is an ABI.
 */
#ifndef OTELBPF_CAPTURE_H
#define OTELBPF_CAPTURE_H

enum event_type {
    EV_DATA = 1,       /* bytes read or written on a socket */
    EV_CONN_OPEN = 2,  /* first sight of (tgid, fd) as a socket */
    EV_CONN_CLOSE = 3, /* close() of a socket we reported */
    EV_PROC_EXIT = 4,  /* a traced process exited */
    EV_CONN_PEER = 5,  /* the peer socket of a Unix connection became known */
};

enum direction {
    DIR_INGRESS = 0, /* the process read the bytes */
    DIR_EGRESS = 1,  /* the process wrote the bytes */
};

enum data_flags {
    DF_SENDFILE = 1,      /* moved by sendfile(): counted, not captured */
    DF_IOV_TRUNCATED = 2, /* more iovecs than the probe walks */
};

enum role_hint {
    ROLE_UNKNOWN = 0,
    ROLE_ACCEPTED = 1,
    ROLE_CONNECTED = 2,
};

/* Every record starts with this header (48 bytes). */
struct event_hdr {
    __u64 ts_ns;   /* CLOCK_MONOTONIC: read exit, write enter */
    __u64 conn_id; /* kernel-assigned, unique per connection sighting */
    __u32 tgid;
    __u32 tid;
    __s32 fd;
    __u8 type;      /* enum event_type */
    __u8 direction; /* enum direction (EV_DATA) */
    __u16 flags;    /* enum data_flags (EV_DATA) */
    __u32 total_len;    /* bytes the syscall moved (EV_DATA) */
    __u32 captured_len; /* bytes of payload following the header */
    /* EV_DATA: the Python coroutine whose asyncio task step made the
     * syscall (opaque, 0 when none): ties calls to the request a task serves. */
    __u64 task_id;
};

/* EV_CONN_OPEN and EV_CONN_PEER: header + this (72 bytes) */
struct conn_info {
    __u16 family; /* AF_INET, AF_INET6, AF_UNIX; 0 when the tuple is unknown */
    __u16 local_port;
    __u16 peer_port;
    __u8 role; /* enum role_hint */
    __u8 protocol;
    __u8 local_addr[16]; /* IPv4 in the first 4 bytes */
    __u8 peer_addr[16];
    char comm[16];
    /* Opaque socket identities (kernel sock addresses, never exported):
     * for Unix sockets, the client's peer_sock_id is the server's sock_id,
     * which pairs the two ends of one connection. */
    __u64 sock_id;
    __u64 peer_sock_id;
};

/* Indexes of the per-CPU counter array `stats`. */
enum stat_index {
    STAT_LOST = 0,         /* ring buffer full: records dropped */
    STAT_IO_MAP_FULL = 1,  /* too many syscalls in flight to remember one */
    STAT_NO_TUPLE = 2,     /* connection opened without a known tuple */
    STAT_COUNT = 3,
};

#endif
