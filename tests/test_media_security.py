"""Image inputs are attack surface (issue 24 part 3): data: URLs always; local files only
under --allowed-local-media-path; http(s) only from --allowed-media-domains hosts (fetched
with a size cap and a timeout; here from a loopback server, never the network); undecodable
bytes, unsupported formats, too many images and decompression bombs are 400s with the error
JSON, decided before decoding where possible; the engine keeps serving."""
from __future__ import annotations

import http.server
import io
import threading
import time

import pytest
from PIL import Image

import mm_models as mm
from servers import Server, _engine
from test_server import _ok
from vllm.multimodal.image import MediaError, decode_image
from vllm.multimodal.media import MediaPolicy

PNG = mm.encoded(mm.picture(3))
BOMB = mm.png_declaring(10_000, 10_000)      # 300 MB of RGB once decoded
HUGE_BOMB = mm.png_declaring(50_000, 50_000)  # beyond Pillow's own cap too


# ----- a loopback image host -----------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://example.invalid/cat.png")
            self.end_headers()
            return
        if self.path == "/slow":
            time.sleep(1.5)
        body = PNG if self.path != "/big" else b"\0" * 4096
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def media_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "allowed").mkdir()
    (root / "allowed" / "cat.png").write_bytes(PNG)
    (root / "secret.png").write_bytes(PNG)
    (root / "allowed" / "link.png").symlink_to(root / "secret.png")
    return root


# ----- the policy, unit by unit ---------------------------------------------------------
def test_data_url_decodes_to_the_same_pixels():
    img = MediaPolicy().load_image(mm.data_url(PNG))
    assert img.mode == "RGB" and img.tobytes() == mm.picture(3).tobytes()


@pytest.mark.parametrize("url,needle", [
    ("file:///etc/passwd", "--allowed-local-media-path"),
    ("http://example.com/cat.png", "--allowed-media-domains"),
    ("https://example.com/cat.png", "--allowed-media-domains"),
    ("ftp://example.com/cat.png", "Unsupported image URL scheme"),
    ("/etc/passwd", "Unsupported image URL scheme"),
    ("data:image/png,notbase64", "must be base64"),
    ("data:image/png;base64,@@@@", "not valid base64"),
])
def test_refused_by_default_before_any_access(url, needle):
    with pytest.raises(MediaError, match=needle):
        MediaPolicy().load_image(url)


def test_local_files_only_under_the_allowed_directory(media_dir):
    policy = MediaPolicy(allowed_local_media_path=str(media_dir / "allowed"))
    assert policy.load_image(f"file://{media_dir}/allowed/cat.png").size == (48, 40)
    for url in (f"file://{media_dir}/secret.png",
                f"file://{media_dir}/allowed/../secret.png",
                f"file://{media_dir}/allowed/link.png"):  # a symlink pointing out
        with pytest.raises(MediaError, match="outside the allowed local media path"):
            policy.load_image(url)


def test_http_only_from_allowed_hosts_with_caps(image_host, monkeypatch):
    policy = MediaPolicy(allowed_media_domains=("127.0.0.1",))
    assert policy.load_image(f"{image_host}/cat.png").tobytes() == mm.picture(3).tobytes()
    with pytest.raises(MediaError, match="redirects to 'example.invalid'"):
        policy.load_image(f"{image_host}/redirect")
    monkeypatch.setenv("VLLM_MEDIA_MAX_BYTES", "1000")
    with pytest.raises(MediaError, match="more than the 1000 allowed"):
        MediaPolicy(allowed_media_domains=("127.0.0.1",)).load_image(f"{image_host}/big")
    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "0.3")
    with pytest.raises(MediaError, match="could not be fetched"):
        MediaPolicy(allowed_media_domains=("127.0.0.1",)).load_image(f"{image_host}/slow")
    with pytest.raises(MediaError, match="not allowed for host 'localhost'"):
        policy.load_image(image_host.replace("127.0.0.1", "localhost") + "/cat.png")


def _bytes_of(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("data,needle", [
    (b"definitely not an image", "could not be decoded"),
    (_bytes_of("TIFF"), "could not be decoded"),            # a format not allowed
    (PNG[: len(PNG) // 2], "truncated or corrupt"),
    (BOMB, "declares 10000x10000 = 100000000 pixels"),   # refused from the header
    (HUGE_BOMB, "more pixels than the"),
], ids=["garbage", "tiff", "truncated", "bomb", "huge-bomb"])
def test_bad_bytes_are_refused(data, needle):
    with pytest.raises(MediaError, match=needle):
        decode_image(data)


def test_pixel_cap_is_checked_on_the_declared_size(monkeypatch):
    monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", str(48 * 40 - 1))
    with pytest.raises(MediaError, match="48x40"):
        MediaPolicy().load_image(mm.data_url(PNG))


# ----- the server -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory, media_dir):
    clip = str(mm.make_clip(tmp_path_factory.mktemp("clip_media") / "model"))
    engine = _engine(clip, allowed_local_media_path=str(media_dir / "allowed"),
                     allowed_media_domains=["127.0.0.1"])
    srv = Server(engine)
    yield srv
    srv.close()
    engine.shutdown()


def _image_messages(*urls: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}}
                                         for u in urls]}]


def _assert_400(response, needle: str, param: str = "messages") -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert error["param"] == param and needle in error["message"]


def test_server_refusals_are_400s_and_it_keeps_serving(server, media_dir, image_host):
    cases = [
        (_image_messages("http://example.com/cat.png"), "--allowed-media-domains"),
        (_image_messages(f"file://{media_dir}/secret.png"), "outside the allowed"),
        (_image_messages(mm.data_url(b"garbage")), "could not be decoded"),
        (_image_messages(mm.data_url(_bytes_of("TIFF"), "image/tiff")), "could not be decoded"),
        (_image_messages(mm.data_url(BOMB)), "10000x10000"),
        (_image_messages(mm.data_url(PNG), mm.data_url(PNG)), "At most 1 image"),
        ([{"role": "user", "content": [{"type": "video_url"}]}], "Unsupported content part"),
    ]
    for messages, needle in cases:
        _assert_400(server.post("/v1/embeddings", {"messages": messages}), needle)
    doc = {"content": [{"type": "image_url", "image_url": {"url": mm.data_url(BOMB)}}]}
    _assert_400(server.post("/rerank", {"query": "a cat", "documents": [doc]}), "10000x10000",
                "documents")
    ok = [_ok(server.post("/v1/embeddings", {"messages": _image_messages(url)}))
          for url in (mm.data_url(PNG), f"file://{media_dir}/allowed/cat.png",
                      f"{image_host}/cat.png")]
    assert ok[0]["data"][0]["embedding"] == ok[1]["data"][0]["embedding"] == \
        ok[2]["data"][0]["embedding"]
    assert server.client.get("/health").status_code == 200


def test_messages_on_a_text_model_are_a_400(minilm):
    _assert_400(minilm.post("/v1/embeddings", {"messages": _image_messages(
        mm.data_url(PNG))}), "send `input`")


def test_serve_flags_reach_the_media_policy(tmp_path_factory, media_dir):
    from vllm.entrypoints.openai.cli_args import engine_args_from_namespace, parse_serve_args
    clip = str(mm.make_clip(tmp_path_factory.mktemp("clip_flags") / "model"))
    args = parse_serve_args([clip, "--limit-mm-per-prompt", '{"image": 0}',
                             "--allowed-local-media-path", str(media_dir / "allowed"),
                             "--allowed-media-domains", "Images.Example.com", "cdn.example.org"])
    mc = engine_args_from_namespace(args).create_engine_config().model_config
    assert mc.mm_limit("image") == 0
    policy = mc.media_policy
    assert policy.allowed_local_media_path == str(media_dir / "allowed")
    assert policy.allowed_media_domains == ("images.example.com", "cdn.example.org")
    with pytest.raises(ValueError, match="is not a directory"):
        engine_args_from_namespace(parse_serve_args(
            [clip, "--allowed-local-media-path", str(media_dir / "nope")])
        ).create_engine_config()
