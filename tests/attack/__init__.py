"""Each attack of the security review, replayed for real as an unprivileged user against the real tool."""
