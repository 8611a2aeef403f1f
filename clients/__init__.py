"""Clients of rlbus's inference servers and the contracts both sides share: the token-in /
token-out client, the renderer that turns messages into token ids and back, and the request
and response structs of /v1/generate and /v1/score. Producers (the interception server's train
backend) and consumers (the orchestrator's teacher) import these, never the server package."""
