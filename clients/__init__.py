"""Clients of rlbus's inference servers and the contracts both sides share: the token-in /
token-out client (`inference`), the structs of /v1/generate and /v1/score (`token_api`), the
OpenAI chat-completions wire format every chat server speaks (`openai_wire`), and the renderer
that turns messages into token ids and back. Producers (the interception server's train
backend) and consumers (the orchestrator's teacher) import these, never the server package."""
