"""The Gradio Blocks wiring of the demo: a customer picker above six tabs, each calling a function of
:mod:`slmlab.transactions.demo.tabs` (where all the logic lives and is tested).

Offline by construction: ``GRADIO_ANALYTICS_ENABLED=False`` is set before Gradio is imported (no
usage reports, no version check), no share link is ever created, server-side rendering (which
needs Node) is off, and the theme uses the system's fonts, so the page requests nothing but the
local server (the browser test checks this with every non-local host unresolvable).
"""

from __future__ import annotations

import os
import socket

from .state import SPREES, DemoState
from .tabs import (
    baselines_view,
    data_view,
    inject_spree,
    model_view,
    next_view,
    occlusion_view,
    score_view,
    similarity_view,
)

SYSTEM_FONTS = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "Roboto", "sans-serif"]
SYSTEM_MONO = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]


def check_port(host: str, port: int) -> None:
    """Raise ``ValueError`` naming ``port`` when it cannot be bound on ``host``."""
    if not 0 < int(port) < 65536:
        raise ValueError(f"port {port} is outside 1-65535; pass --port with a free port (default 7860)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, int(port)))
        except OSError as err:
            raise ValueError(f"port {port} on {host} is in use or not available ({err.strerror}); "
                             "pass --port with a free port") from None


def _gradio():
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    import gradio as gr

    return gr


def _styled(table, rows: list[int]):
    """The table with its fraudulent rows tinted (a pandas Styler, which Gradio renders)."""
    if not rows or table.empty:
        return table
    tint = table.style.apply(lambda r: ["background-color: #f8c9c4" if r.name in rows else "" for _ in r], axis=1)
    return tint.format(precision=2, na_rep="")


def build_app(state: DemoState):
    """The ``gr.Blocks`` of the demo on ``state``."""
    gr = _gradio()
    names = state.model.encoder.feature_names
    choices = state.customer_ids()
    with gr.Blocks(title="slmlab transactions demo", analytics_enabled=False) as app:
        injected = gr.State(None)
        gr.Markdown("## Transaction encoder demo\nA synthetic bank, the LFM2 transaction encoder and its fraud head. "
                    "Customers with a fraud in the test period are listed first.")
        with gr.Row():
            customer = gr.Dropdown(choices, value=choices[0], label="customer", allow_custom_value=True,
                                   elem_id="customer", scale=3)
            message = gr.Markdown("", elem_id="message")
        with gr.Tabs():
            with gr.Tab("Data", id="data", elem_id="tab-data"):
                highlight = gr.Checkbox(False, label="highlight ground-truth fraud", elem_id="highlight")
                with gr.Row():
                    map_plot = gr.Plot(label="card-present locations vs home", show_label=False)
                    hour_plot = gr.Plot(label="local hour of day", show_label=False)
                data_table = gr.Dataframe(label="last 64 transactions (raw values and decoded tokens)",
                                          elem_id="data-table", max_height=420, wrap=False)
            with gr.Tab("Next transaction", id="next", elem_id="tab-next"):
                with gr.Row():
                    fixed = gr.Textbox("", label="fixed fields (name=id, comma separated; ids from the tables)",
                                       elem_id="fixed", scale=3)
                    predict = gr.Button("predict", elem_id="predict", variant="primary")
                samples = gr.Dataframe(label="5 sampled next transactions", elem_id="samples", wrap=False)
                head_tables = []
                for row in range(5):
                    with gr.Row():
                        for f in range(row * 3, row * 3 + 3):
                            head_tables.append(gr.Dataframe(label=f"head {f}: {names[f]}", elem_id=f"head-{f}",
                                                            elem_classes=["head-table"], wrap=False))
            with gr.Tab("Fraud scoring", id="scoring", elem_id="tab-scoring"):
                with gr.Row():
                    score_btn = gr.Button("score history", elem_id="score", variant="primary")
                    spree_btns = [gr.Button(f"inject {k.replace('_', ' ')}", elem_id=f"inject-{k}") for k in SPREES]
                    reset_btn = gr.Button("remove injected", elem_id="reset")
                timeline = gr.Plot(label="score timeline", show_label=False)
                score_table = gr.Dataframe(label="scores of the last 64 transactions", elem_id="score-table",
                                           max_height=360, wrap=False)
                occl_btn = gr.Button("occlusion attribution (top 5)", elem_id="occlusion")
                occl_table = gr.Dataframe(label="score change when one earlier transaction is masked",
                                          elem_id="occlusion-table", wrap=False)
            with gr.Tab("Customer similarity", id="similarity", elem_id="tab-similarity"):
                sim_btn = gr.Button("embed customers", elem_id="embed", variant="primary")
                with gr.Row():
                    pca_plot = gr.Plot(label="PCA of customer embeddings", show_label=False)
                    with gr.Column():
                        knn = gr.Markdown("", elem_id="knn")
                        neighbours = gr.Dataframe(label="nearest neighbours (cosine)", elem_id="neighbours")
            with gr.Tab("Baselines", id="baselines", elem_id="tab-baselines"):
                base = baselines_view(state)
                gr.Plot(base.fig, label="test-period precision-recall", show_label=False)
                gr.Dataframe(base.table.round(3) if not base.table.empty else base.table, elem_id="baselines-table",
                             label="PR-AUC and per-pattern recall at each model's validation 1%-FPR threshold")
                if base.message:
                    gr.Markdown(base.message)
            with gr.Tab("Model & schema", id="model", elem_id="tab-model"):
                mv = model_view(state)
                with gr.Row():
                    gr.Dataframe(mv.layers, label="layer order")
                    gr.Dataframe(mv.params, label="param_count()")
                with gr.Row():
                    gr.Dataframe(mv.schema, label="schema (vocabulary sizes include 4 special ids)", max_height=640)
                    gr.Dataframe(mv.amount_edges.round(2), label="fitted amount bins")

        def on_data(cid, hl, inj):
            v = data_view(state, cid, hl, inj)
            return v.map_fig, v.hour_fig, _styled(v.table, v.fraud_rows), v.message

        def on_next(cid, text, inj):
            v = next_view(state, cid, text, inj)
            if v.message:
                return [None] * 16 + [v.message]
            heads = [h.assign(probability=h["probability"].round(4), **{"history share": h["history share"].round(3)})
                     for h in v.heads]
            return [v.samples, *heads, ""]

        def on_score(cid, inj):
            v = score_view(state, cid, inj)
            table = v.table.assign(score=v.table["score"].round(4)) if not v.table.empty else v.table
            return v.fig, table, v.message

        def on_inject(kind):
            def run(cid, inj):
                new, msg = inject_spree(state, cid, kind, inj)
                return (new, *on_score(cid, new)[:2], msg)
            return run

        def on_reset(cid):
            return (None, *on_score(cid, None)[:2], "injected transactions removed")

        def on_occlusion(cid, inj):
            table, msg = occlusion_view(state, cid, inj)
            return (table.round(5) if not table.empty else table), msg

        def on_similarity(cid):
            v = similarity_view(state, cid)
            if v.message:
                return None, "", None, v.message
            return v.fig, f"**5-NN archetype accuracy {v.knn_accuracy:.2f}** (majority class {v.chance:.2f})", \
                v.neighbours.round(3), ""

        data_out = [map_plot, hour_plot, data_table, message]
        for trigger in (customer.change, highlight.change):
            trigger(on_data, [customer, highlight, injected], data_out)
        app.load(on_data, [customer, highlight, injected], data_out)
        predict.click(on_next, [customer, fixed, injected], [samples, *head_tables, message])
        score_btn.click(on_score, [customer, injected], [timeline, score_table, message])
        for kind, btn in zip(SPREES, spree_btns):
            btn.click(on_inject(kind), [customer, injected], [injected, timeline, score_table, message])
        reset_btn.click(on_reset, [customer], [injected, timeline, score_table, message])
        occl_btn.click(on_occlusion, [customer, injected], [occl_table, message])
        sim_btn.click(on_similarity, [customer], [pca_plot, knn, neighbours, message])
    return app


def launch(state: DemoState, host: str = "127.0.0.1", port: int = 7860, block: bool = True):
    """Serve the demo on ``host:port`` (never a share link); ``ValueError`` when the port is taken."""
    check_port(host, port)
    gr = _gradio()
    app = build_app(state)
    theme = gr.themes.Default(font=SYSTEM_FONTS, font_mono=SYSTEM_MONO)
    app.queue(default_concurrency_limit=1)
    return app.launch(server_name=host, server_port=int(port), share=False, theme=theme, ssr_mode=False,
                      prevent_thread_lock=not block, show_error=True, quiet=False)
