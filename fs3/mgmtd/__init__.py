"""The cluster manager (fs3-mgmtd): membership, routing info, chain states, admin API."""
