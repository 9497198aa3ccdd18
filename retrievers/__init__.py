"""Retrievers: sources of context chunks emitted as streams (crawler, FAISS, trace replay).

Every retriever is an async iterator of ``events.ContextEvent`` (AppendChunk, ReplaceContext,
SourceError, Done). Modules: ``crawler`` (+ ``fetch``, ``robots``, ``netguard``, ``extract``,
``search_client``, ``crawler_config``), ``local_site`` (the offline corpus as a loopback web),
``vector`` / ``vector_index`` / ``embedding`` (progressive FAISS), ``replay`` / ``recording``
(QueryTraces), ``ray_actors`` (the only module that imports Ray), ``cli_index``.
"""
