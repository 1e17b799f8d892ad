"""One HTTP/1.1 request over a Domus API Unix socket (the daemon's or a
domain's), for the bench scripts: bench/control and bench/io import it."""
import socket


def request(sock_path, method, path, body=None, timeout=600):
    """Returns (status, body text); socket.timeout when a read or write
    waits longer than `timeout` seconds."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(sock_path)
    data = body.encode() if body else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    s.sendall(head.encode() + b"\r\n" + data)
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    head, _, rest = out.partition(b"\r\n\r\n")
    return int(head.split()[1]), rest.decode()
