"""Talk to a realtime_omni server from the browser through a Gradio/FastRTC app.

    pip install -e '.[embedded,fastrtc]'
    realtime-omni serve --port 8000 &                     # the server (embedded CPU models)
    python examples/gradio_fastrtc_app.py --url http://127.0.0.1:8000

Open the printed Gradio URL, allow the microphone and speak; the server's VAD decides when you
have finished, the reply streams back, and speaking over it interrupts it. Transcripts of both
sides appear in the chat box.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the realtime_omni server (default: %(default)s)")
    parser.add_argument("--model", default="embedded", help="model to talk to (default: %(default)s)")
    parser.add_argument("--instructions", default="You are a friendly voice assistant. Keep answers short.")
    parser.add_argument("--voice", default=None)
    parser.add_argument("--host", default="127.0.0.1", help="where Gradio listens (default: %(default)s)")
    parser.add_argument("--port", type=int, default=7860)
    args = parser.parse_args()

    import gradio as gr
    from fastrtc import Stream

    from realtime_omni.integrations.fastrtc_handler import RealtimeOmniHandler

    chatbot = gr.Chatbot(type="messages", label="Transcript")

    def update_chat(history: list[dict] | None, message: dict) -> list[dict]:
        # the handler's AdditionalOutputs({"role": ..., "content": ...}) land here
        return [*(history or []), message]

    stream = Stream(
        handler=RealtimeOmniHandler(args.url, model=args.model, instructions=args.instructions, voice=args.voice),
        modality="audio",
        mode="send-receive",
        additional_outputs=[chatbot],
        additional_outputs_handler=update_chat,
        ui_args={"title": "realtime_omni voice chat"},
    )
    stream.ui.launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
