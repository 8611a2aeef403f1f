"""The read models: every query the store's readers run (`rlbus ui` and `rlbus report`, the eval
summary, `rlbus run`'s dashboard, the quickstart and its recipe, rescore, replay, the broker-loss
count), next to the views they read (bus/store/views/). One module per reader, named for it;
a query two readers run is written once, in `common.py` or with its main reader, and imported.

Each is plain SQL text (a function where the text is built from fixed parts); whatever a user
gave travels as a `{name:Type}` parameter value. The code that runs a query and shapes its rows
stays with its reader. The roles' own SQL (the sink, the orchestrator, the store's internals)
is not here."""
