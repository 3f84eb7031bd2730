/*
 * test_codec.c - unit tests for codec.c without Lua: varints, zigzag, the C
 * writers, the validator on good and hostile input, lei_msg_iov, and a
 * deterministic random-mutation loop. Prints "N passed, N failed" and exits
 * nonzero on failure.
 *
 *   gcc -O2 -g -Wall -Wextra -Werror -std=gnu99 core/base/codec.c core/test/test_codec.c \
 *       -Icore/base -Icore/test -o build/test_codec && ./build/test_codec
 */
#include "codec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

/* validate and return the static message ("" on success) */
static const char *vmsg(const void *p, size_t n, const lei_codec_limits *lim)
{
	const char *err = NULL;
	int rc = lei_codec_validate(p, n, lim, &err);
	if (rc == 0)
		return err == NULL ? "" : "BUG: message on success";
	return err ? err : "BUG: no message";
}

static void test_varint(void)
{
	static const uint64_t vals[] = { 0, 1, 127, 128, 255, 300, 16383, 16384,
	                                 (1ull << 32) - 1, 1ull << 32, 1ull << 63,
	                                 UINT64_MAX };
	static const size_t lens[] = { 1, 1, 1, 2, 2, 2, 2, 3, 5, 5, 10, 10 };
	uint8_t buf[16];
	uint64_t v;
	size_t i, n, used;

	for (i = 0; i < sizeof vals / sizeof vals[0]; i++) {
		n = lei_varint_encode(buf, vals[i]);
		CHECK(n == lens[i]);
		CHECK(lei_varint_decode(buf, n, &v, &used) == 0 && v == vals[i] && used == n);
		/* every strict prefix is truncated */
		for (size_t k = 0; k < n; k++)
			CHECK(lei_varint_decode(buf, k, &v, &used) == LEI_ETRUNC);
	}
	/* exact bytes */
	n = lei_varint_encode(buf, 128);
	CHECK(n == 2 && buf[0] == 0x80 && buf[1] == 0x01);
	n = lei_varint_encode(buf, UINT64_MAX);
	CHECK(n == 10 && buf[9] == 0x01);
	/* 10th byte > 1: invalid */
	memset(buf, 0xff, 9);
	buf[9] = 0x02;
	CHECK(lei_varint_decode(buf, 10, &v, &used) == LEI_EBADVARINT);
	/* overlong: 11 bytes, the 10th still has the continuation bit */
	memset(buf, 0x80, 11);
	buf[10] = 0x00;
	CHECK(lei_varint_decode(buf, 11, &v, &used) == LEI_EBADVARINT);
	/* a non-minimal encoding within 10 bytes is accepted: 0 in 2 bytes */
	buf[0] = 0x80;
	buf[1] = 0x00;
	CHECK(lei_varint_decode(buf, 2, &v, &used) == 0 && v == 0 && used == 2);
	/* truncated: continuation bit on the last available byte */
	CHECK(lei_varint_decode(buf, 1, &v, &used) == LEI_ETRUNC);
	CHECK(lei_varint_decode(buf, 0, &v, &used) == LEI_ETRUNC);
}

static void test_zigzag(void)
{
	static const int64_t vals[] = { 0, -1, 1, -2, 2, 63, -64, INT64_MAX, INT64_MIN,
	                                9007199254740992LL, -9007199254740992LL };
	size_t i;
	CHECK(lei_zigzag_encode(0) == 0);
	CHECK(lei_zigzag_encode(-1) == 1);
	CHECK(lei_zigzag_encode(1) == 2);
	CHECK(lei_zigzag_encode(-2) == 3);
	CHECK(lei_zigzag_encode(INT64_MAX) == UINT64_MAX - 1);
	CHECK(lei_zigzag_encode(INT64_MIN) == UINT64_MAX);
	for (i = 0; i < sizeof vals / sizeof vals[0]; i++)
		CHECK(lei_zigzag_decode(lei_zigzag_encode(vals[i])) == vals[i]);
}

/* read back one number written by lei_enc_number */
static int number_roundtrip(double x, int want_tag, double *out)
{
	lei_wbuf b = { 0 };
	lei_reader r;
	lei_item it;
	int ok;

	if (lei_enc_number(&b, x))
		return 0;
	lei_reader_init(&r, (uint8_t *)b.data, b.len, NULL);
	ok = lei_codec_read_item(&r, &it) == 0 && lei_reader_finish(&r) == 0 &&
	     it.tag == want_tag && (uint8_t)b.data[0] == want_tag;
	*out = it.num;
	lei_wbuf_free(&b);
	return ok;
}

static void test_writers(void)
{
	lei_wbuf b = { 0 };
	double y;

	CHECK(number_roundtrip(0, LEI_T_INT, &y) && y == 0 && !signbit(y));
	CHECK(number_roundtrip(-0.0, LEI_T_DOUBLE, &y) && y == 0 && signbit(y));
	CHECK(number_roundtrip(LEI_INT_EXACT, LEI_T_INT, &y) && y == LEI_INT_EXACT);
	CHECK(number_roundtrip(-LEI_INT_EXACT, LEI_T_INT, &y) && y == -LEI_INT_EXACT);
	CHECK(number_roundtrip(LEI_INT_EXACT + 2, LEI_T_DOUBLE, &y) && y == LEI_INT_EXACT + 2);
	CHECK(number_roundtrip(1.5, LEI_T_DOUBLE, &y) && y == 1.5);
	CHECK(number_roundtrip(-42, LEI_T_INT, &y) && y == -42);
	CHECK(number_roundtrip(INFINITY, LEI_T_DOUBLE, &y) && isinf(y) && y > 0);
	CHECK(number_roundtrip(-INFINITY, LEI_T_DOUBLE, &y) && isinf(y) && y < 0);
	CHECK(number_roundtrip(NAN, LEI_T_DOUBLE, &y) && isnan(y));
	CHECK(number_roundtrip(1e300, LEI_T_DOUBLE, &y) && y == 1e300);

	/* exact bytes of a small composite: {10, "hi", [true] = -1.5} */
	CHECK(lei_enc_table_header(&b, 2, 1) == 0);
	CHECK(lei_enc_number(&b, 10) == 0);
	CHECK(lei_enc_string(&b, "hi", 2) == 0);
	CHECK(lei_enc_bool(&b, 1) == 0);
	CHECK(lei_enc_number(&b, -1.5) == 0);
	{
		static const uint8_t want[] = { 0x06, 0x02, 0x01, 0x03, 0x14, 0x05, 0x02, 'h', 'i',
		                                0x02, 0x04, 0, 0, 0, 0, 0, 0, 0xf8, 0xbf };
		CHECK(b.len == sizeof want && memcmp(b.data, want, sizeof want) == 0);
	}
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);
	lei_wbuf_free(&b);
	CHECK(b.data == NULL && b.len == 0 && b.cap == 0);

	/* binary-safe string, empty string, nil, false */
	CHECK(lei_enc_string(&b, "a\0b", 3) == 0);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);
	b.len = 0;
	CHECK(lei_enc_string(&b, "", 0) == 0 && b.len == 2);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);
	b.len = 0;
	CHECK(lei_enc_nil(&b) == 0 && lei_enc_bool(&b, 0) == 0 && b.len == 2 &&
	      b.data[0] == 0 && b.data[1] == 1);
	lei_wbuf_free(&b);

	/* reserve refuses size overflow and leaves the buffer alone */
	CHECK(lei_wbuf_put_u8(&b, 7) == 0);
	CHECK(lei_wbuf_reserve(&b, SIZE_MAX) == -1 && b.len == 1 && b.data[0] == 7);
	CHECK(lei_wbuf_put_varint(&b, 300) == 0 && b.len == 3);
	CHECK(lei_wbuf_put(&b, "xyz", 3) == 0 && b.len == 6 && memcmp(b.data + 3, "xyz", 3) == 0);
	lei_wbuf_free(&b);
}

/* a nested value exercising every tag */
static void build_nested(lei_wbuf *b)
{
	lei_enc_table_header(b, 3, 3);
	lei_enc_number(b, 1);
	lei_enc_string(b, "two", 3);
	lei_enc_table_header(b, 2, 0);
	lei_enc_number(b, 3.25);
	lei_enc_nil(b);
	lei_enc_string(b, "k", 1);
	lei_enc_bool(b, 0);
	lei_enc_number(b, -7);
	lei_enc_table_header(b, 0, 1);
	lei_enc_bool(b, 1);
	lei_enc_number(b, 1e100);
	lei_enc_table_header(b, 0, 0);
	lei_enc_string(b, "", 0);
}

static void test_validate(void)
{
	lei_wbuf b = { 0 };
	lei_codec_limits lim;
	size_t i, full;
	uint8_t buf[64];

	lei_codec_limits_default(&lim);
	CHECK(lim.max_string == 268435456 && lim.max_depth == 100);

	build_nested(&b);
	full = b.len;
	CHECK(strcmp(vmsg(b.data, full, NULL), "") == 0);
	/* truncated at every byte position: inside a table the missing bytes
	 * are often caught as soon as a header claims more than is left */
	for (i = 0; i < full; i++) {
		const char *e = vmsg(b.data, i, NULL);
		CHECK(strcmp(e, "truncated input") == 0 ||
		      strcmp(e, "table count exceeds input") == 0);
		if (i < 3 || i == full - 1) /* header or last byte cut */
			CHECK(strcmp(e, "truncated input") == 0);
	}
	/* trailing garbage */
	lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "trailing garbage after value") == 0);
	lei_wbuf_free(&b);

	/* unknown tags, top level and nested */
	for (i = 8; i < 256; i++) {
		buf[0] = (uint8_t)i;
		CHECK(strncmp(vmsg(buf, 1, NULL), "unknown tag", 11) == 0);
	}
	memcpy(buf, "\x06\x01\x00\x08", 4);
	CHECK(strncmp(vmsg(buf, 4, NULL), "unknown tag", 11) == 0);

	/* bad varint in a string length */
	buf[0] = LEI_T_STRING;
	memset(buf + 1, 0xff, 10);
	CHECK(strcmp(vmsg(buf, 11, NULL), "invalid varint") == 0);
	CHECK(strcmp(vmsg(buf, 5, NULL), "truncated input") == 0);

	/* huge string length: over the limit, then under the limit but over input */
	b.len = 0;
	lei_wbuf_put_u8(&b, LEI_T_STRING);
	lei_wbuf_put_varint(&b, UINT64_MAX);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "string too long") == 0);
	b.len = 0;
	lei_wbuf_put_u8(&b, LEI_T_STRING);
	lei_wbuf_put_varint(&b, 1000);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "truncated input") == 0);
	/* the limit is inclusive */
	lim.max_string = 3;
	b.len = 0;
	lei_enc_string(&b, "abc", 3);
	CHECK(strcmp(vmsg(b.data, b.len, &lim), "") == 0);
	b.len = 0;
	lei_enc_string(&b, "abcd", 4);
	CHECK(strcmp(vmsg(b.data, b.len, &lim), "string too long") == 0);
	lei_codec_limits_default(&lim);

	/* huge table counts */
	b.len = 0;
	lei_enc_table_header(&b, UINT64_MAX, 0);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "table count exceeds input") == 0);
	b.len = 0;
	lei_enc_table_header(&b, 0, UINT64_MAX);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "table count exceeds input") == 0);
	b.len = 0;
	lei_enc_table_header(&b, 1ull << 62, 1ull << 62);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "table count exceeds input") == 0);
	/* exactly enough bytes passes the count check: 3 nils, 1 pair (2 bytes) */
	b.len = 0;
	lei_enc_table_header(&b, 3, 1);
	for (i = 0; i < 3; i++)
		lei_enc_nil(&b);
	lei_enc_bool(&b, 1);
	lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);
	/* one pair needs two bytes: {nhash=1} followed by one byte is a count error */
	b.len = 0;
	lei_enc_table_header(&b, 0, 1);
	lei_enc_bool(&b, 1);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "table count exceeds input") == 0);
	/* counts are global: an inner table may not claim the bytes its parent's
	 * remaining slots need. outer {narr=2}: inner {narr=2} + 1 value = 4 bytes
	 * left after the inner header, inner claims 2, outer still owes 1 -> ok;
	 * but inner {narr=3} claims 3 + owed 1 > 3 left -> count error */
	b.len = 0;
	lei_enc_table_header(&b, 2, 0);
	lei_enc_table_header(&b, 3, 0);
	lei_enc_nil(&b);
	lei_enc_nil(&b);
	lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "table count exceeds input") == 0);
	lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);

	/* nil and NaN keys */
	b.len = 0;
	lei_enc_table_header(&b, 0, 1);
	lei_enc_nil(&b);
	lei_enc_bool(&b, 1);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "nil or NaN table key") == 0);
	b.len = 0;
	lei_enc_table_header(&b, 0, 1);
	lei_enc_number(&b, NAN);
	lei_enc_bool(&b, 1);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "nil or NaN table key") == 0);
	/* a table as key is fine */
	b.len = 0;
	lei_enc_table_header(&b, 0, 1);
	lei_enc_table_header(&b, 0, 0);
	lei_enc_bool(&b, 1);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "") == 0);

	/* depth: 100 nested tables pass, 101 fail; a 1 MB depth bomb fails fast */
	for (size_t depth = 99; depth <= 101; depth++) {
		b.len = 0;
		for (i = 0; i < depth; i++)
			lei_enc_table_header(&b, i + 1 < depth ? 1 : 0, 0);
		CHECK(strcmp(vmsg(b.data, b.len, NULL), depth <= 100 ? "" : "nesting too deep") == 0);
	}
	lim.max_depth = 0;
	CHECK(strcmp(vmsg("\x06\x00\x00", 3, &lim), "nesting too deep") == 0);
	CHECK(strcmp(vmsg("\x03\x02", 2, &lim), "") == 0);
	lim.max_depth = 100000; /* clamped to LEI_MAX_DEPTH_CEIL */
	b.len = 0;
	for (i = 0; i < 1000000; i++)
		lei_enc_table_header(&b, 1, 0);
	lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "nesting too deep") == 0);
	CHECK(strcmp(vmsg(b.data, b.len, &lim), "nesting too deep") == 0);
	/* same bomb through the key slot ({[{[{...}] = x}] = x}) */
	b.len = 0;
	for (i = 0; i < 200; i++)
		lei_enc_table_header(&b, 0, 1);
	lei_enc_table_header(&b, 0, 0);
	for (i = 0; i < 200; i++)
		lei_enc_nil(&b);
	CHECK(strcmp(vmsg(b.data, b.len, NULL), "nesting too deep") == 0);
	lim.max_depth = 1000;
	CHECK(strcmp(vmsg(b.data, b.len, &lim), "") == 0);
	b.len -= 1;
	CHECK(strcmp(vmsg(b.data, b.len, &lim), "truncated input") == 0);
	lei_wbuf_free(&b);

	/* empty input */
	CHECK(strcmp(vmsg(NULL, 0, NULL), "truncated input") == 0);
	/* doubles need 8 bytes */
	CHECK(strcmp(vmsg("\x04\0\0\0\0\0\0\0", 8, NULL), "truncated input") == 0);
	CHECK(strcmp(vmsg("\x04\0\0\0\0\0\0\0\0", 9, NULL), "") == 0);
}

static void test_reader_messages(void)
{
	lei_reader r;
	lei_item it;
	char msg[128];
	int rc;

	lei_reader_init(&r, (const uint8_t *)"\x06\x01\x00\x09", 4, NULL);
	CHECK(lei_codec_read_item(&r, &it) == 0 && it.tag == LEI_T_TABLE && it.narr == 1);
	rc = lei_codec_read_item(&r, &it);
	CHECK(rc == LEI_ETAG);
	CHECK(strcmp(lei_reader_strerror(&r, rc, msg, sizeof msg), "unknown tag 0x09 at byte 3") == 0);

	lei_reader_init(&r, (const uint8_t *)"\x00\x00\x00", 3, NULL);
	CHECK(lei_codec_read_item(&r, &it) == 0);
	rc = lei_reader_finish(&r);
	CHECK(rc == LEI_ETRAIL);
	CHECK(strcmp(lei_reader_strerror(&r, rc, msg, sizeof msg),
	             "trailing garbage after value (2 bytes)") == 0);
	CHECK(strcmp(lei_reader_strerror(&r, LEI_EDEPTH, msg, sizeof msg),
	             "nesting too deep (limit 100)") == 0);

	lei_reader_init(&r, (const uint8_t *)"\x05\x80\x80\x80\x80\x10", 6, NULL);
	rc = lei_codec_read_item(&r, &it);
	CHECK(rc == LEI_ESTRLEN);
	CHECK(strcmp(lei_reader_strerror(&r, rc, msg, sizeof msg),
	             "string too long (4294967296 bytes, limit 268435456)") == 0);
	CHECK(strcmp(lei_codec_strerror(LEI_ENOMEM), "out of memory") == 0);
}

/* max_value_bytes: the reader charges a table's announced slots with its
 * header, before a decoder presizes them, and strings their length. */
static void test_value_size(void)
{
	lei_codec_limits lim;
	lei_reader r;
	lei_item it;
	char msg[128];
	uint8_t *big;
	size_t n = 5000000, i;
	int rc;

	lei_codec_limits_default(&lim);
	CHECK(lim.max_value_bytes == 67108864);
	/* { "abc", k = true }: 64 + 16 + 32 + (24 + 3) + (24 + 1) = 164 */
	static const char v[] = "\x06\x01\x01\x05\x03" "abc" "\x05\x01k\x02";
	lim.max_value_bytes = 164;
	CHECK(strcmp(vmsg(v, sizeof v - 1, &lim), "") == 0);
	lim.max_value_bytes = 163;
	CHECK(strcmp(vmsg(v, sizeof v - 1, &lim), "value decodes to more than max_value_bytes") == 0);
	lim.max_value_bytes = 0; /* scalars only */
	CHECK(strcmp(vmsg("\x03\x02", 2, &lim), "") == 0);
	CHECK(strcmp(vmsg("\x05\x00", 2, &lim), "value decodes to more than max_value_bytes") == 0);

	/* 5 MB announcing 5 million nil slots: 80 MB charged on the header */
	big = malloc(n + 8);
	CHECK(big != NULL);
	if (!big)
		return;
	big[0] = LEI_T_TABLE;
	i = 1 + lei_varint_encode(big + 1, n - 8);
	big[i++] = 0;
	memset(big + i, 0, n - i);
	lei_reader_init(&r, big, n, NULL);
	rc = lei_codec_read_item(&r, &it);
	CHECK(rc == LEI_ESIZE && r.size == 0);
	CHECK(strcmp(lei_reader_strerror(&r, rc, msg, sizeof msg),
	             "value decodes to more than 67108864 bytes") == 0);
	lim.max_value_bytes = SIZE_MAX; /* and fine without the cap */
	CHECK(strcmp(vmsg(big, i + (n - 8), &lim), "") == 0);
	free(big);
}

static void noop_unpin(void *ud, int ref)
{
	int *count = ud;
	(void)ref;
	(*count)++;
}

static void test_msg_iov(void)
{
	lei_msg *m = lei_msg_new();
	static const char big1[] = "ABCDEFGHIJ", big2[] = "0123456789abcdef";
	char flat[128], want[128], got[128];
	struct iovec iov[8];
	size_t covered, skip;
	int cnt, unpinned = 0;

	CHECK(m != NULL && m->refcnt == 1 && m->total == 0);
	CHECK(lei_msg_iov(m, 0, iov, 8, &covered) == 0 && covered == 0);

	/* own: "xx" [big1] "yyy" [big2] "" ; then one more own byte "z" */
	lei_wbuf_put(&m->own, "xx", 2);
	CHECK(lei_msg_add_ext(m, big1, 10, 11) == 0);
	lei_wbuf_put(&m->own, "yyy", 3);
	CHECK(lei_msg_add_ext(m, big2, 16, 22) == 0);
	lei_msg_sync(m);
	CHECK(m->total == 31);
	strcpy(want, "xxABCDEFGHIJyyy0123456789abcdef");
	CHECK(lei_msg_flatten(m, flat) == 0 && memcmp(flat, want, 31) == 0);

	cnt = lei_msg_iov(m, 0, iov, 8, &covered);
	CHECK(cnt == 4 && covered == 31); /* trailing empty own segment omitted */
	CHECK(iov[1].iov_base == (void *)big1 && iov[1].iov_len == 10);

	lei_wbuf_put(&m->own, "z", 1);
	lei_msg_sync(m);
	strcat(want, "z");
	CHECK(m->total == 32);
	CHECK(lei_msg_flatten(m, flat) == 0 && memcmp(flat, want, 32) == 0);

	/* every skip offset, with room for all and with max = 1 and 2 */
	for (skip = 0; skip <= 33; skip++) {
		for (int max = 1; max <= 8; max++) {
			size_t off = skip, n = 0;
			int guard = 0;
			/* resume repeatedly, as a writer with partial writes would */
			while ((cnt = lei_msg_iov(m, off, iov, max, &covered)) > 0 && guard++ < 100) {
				size_t sum = 0;
				for (int i = 0; i < cnt; i++) {
					CHECK(iov[i].iov_len > 0);
					memcpy(got + n, iov[i].iov_base, iov[i].iov_len);
					n += iov[i].iov_len;
					sum += iov[i].iov_len;
				}
				CHECK(cnt <= max && sum == covered);
				off += covered;
			}
			if (skip >= 32)
				CHECK(n == 0);
			else
				CHECK(n == 32 - skip && memcmp(got, want + skip, n) == 0);
		}
	}
	cnt = lei_msg_iov(m, 5, iov, 8, &covered);
	CHECK(cnt == 4 && covered == 27 && iov[0].iov_base == (void *)(big1 + 3) &&
	      iov[0].iov_len == 7);

	/* refcount: first release keeps it, second unpins both refs and frees */
	m->refcnt++;
	lei_msg_release(m, noop_unpin, &unpinned);
	CHECK(unpinned == 0);
	lei_msg_release(m, noop_unpin, &unpinned);
	CHECK(unpinned == 2);
	lei_msg_release(NULL, noop_unpin, &unpinned);

	/* many slices grow the ext array */
	m = lei_msg_new();
	for (int i = 0; i < 100; i++) {
		lei_enc_nil(&m->own);
		CHECK(lei_msg_add_ext(m, big2, 16, i) == 0);
	}
	lei_msg_sync(m);
	CHECK(m->total == 100 * 17 && m->next == 100);
	unpinned = 0;
	lei_msg_release(m, noop_unpin, &unpinned);
	CHECK(unpinned == 100);
}

/* xorshift64*: deterministic across platforms */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ull;
}

static void test_mutations(void)
{
	lei_wbuf seed[4] = { { 0 }, { 0 }, { 0 }, { 0 } }, work = { 0 };
	long ok = 0, bad = 0, it;
	int s;

	build_nested(&seed[0]);
	lei_enc_table_header(&seed[1], 5, 0);
	for (s = 0; s < 5; s++)
		lei_enc_number(&seed[1], s * 1000.5);
	lei_enc_string(&seed[2], "hello world, a longer string", 28);
	for (s = 0; s < 6; s++)
		lei_enc_table_header(&seed[3], s < 5 ? 1 : 0, s < 5 ? 1 : 0);
	for (s = 0; s < 5; s++) {
		lei_enc_string(&seed[3], "key", 3);
		lei_enc_number(&seed[3], -s);
	}
	for (s = 0; s < 4; s++)
		CHECK(strcmp(vmsg(seed[s].data, seed[s].len, NULL), "") == 0);

	for (it = 0; it < 200000; it++) {
		lei_wbuf *src = &seed[rnd() % 4];
		int flips = 1 + (int)(rnd() % 4), f;
		size_t n;
		const char *err;
		work.len = 0;
		lei_wbuf_put(&work, src->data, src->len);
		for (f = 0; f < flips; f++) {
			size_t at = rnd() % work.len;
			switch (rnd() % 4) {
			case 0: work.data[at] ^= (char)(1u << (rnd() % 8)); break;
			case 1: work.data[at] = (char)rnd(); break;
			case 2: work.data[at] = (char)(rnd() % 8); break;
			default: work.data[at] = (char)0xff; break;
			}
		}
		n = work.len - (rnd() % 3 == 0 ? rnd() % (work.len + 1) : 0);
		/* exact-size heap copy so ASan sees any overread */
		{
			char *exact = malloc(n ? n : 1);
			memcpy(exact, work.data, n);
			if (lei_codec_validate((uint8_t *)exact, n, NULL, &err) == 0)
				ok++;
			else if (err && *err)
				bad++;
			free(exact);
		}
	}
	CHECK(ok + bad == 200000);
	CHECK(ok > 0 && bad > 0);
	printf("mutations: %ld valid, %ld rejected\n", ok, bad);
	for (s = 0; s < 4; s++)
		lei_wbuf_free(&seed[s]);
	lei_wbuf_free(&work);
}

/* The array tag: what validates, and each way a hostile one is refused. */
static void test_arrays(void)
{
	lei_wbuf b = {0};
	int64_t shape[3] = {2, 3, 4};
	double d[24];
	int i;
	const char *err;
	lei_reader r;
	lei_item it;

	for (i = 0; i < 24; i++) d[i] = i * 0.5;
	CHECK(lei_enc_array_header(&b, LEI_DT_F8, 3, shape) == 0);
	CHECK(lei_wbuf_put(&b, d, sizeof d) == 0);
	CHECK(lei_codec_validate((uint8_t *)b.data, b.len, NULL, NULL) == 0);
	lei_reader_init(&r, (uint8_t *)b.data, b.len, NULL);
	CHECK(lei_codec_read_item(&r, &it) == 0 && it.tag == LEI_T_ARRAY && it.dtype == LEI_DT_F8 &&
	      it.ndim == 3 && it.shape[2] == 4 && it.len == sizeof d &&
	      memcmp(it.str, d, sizeof d) == 0 && lei_reader_finish(&r) == 0);
	/* one byte short, one too many */
	CHECK(lei_codec_validate((uint8_t *)b.data, b.len - 1, NULL, &err) == -1 &&
	      strcmp(err, "truncated input") == 0);
	CHECK(lei_wbuf_put_u8(&b, 0) == 0);
	CHECK(lei_codec_validate((uint8_t *)b.data, b.len, NULL, &err) == -1 &&
	      strcmp(err, "trailing garbage after value") == 0);
	lei_wbuf_free(&b);
	/* every dtype name, NumPy's |u1 and |i1, and a bad one */
	for (i = 0; i < LEI_DT_COUNT; i++)
		CHECK(lei_dtype_parse(lei_dtype_name(i), 3) == i);
	CHECK(lei_dtype_parse("|u1", 3) == LEI_DT_U1 && lei_dtype_parse("|i1", 3) == LEI_DT_I1);
	CHECK(lei_dtype_parse(">f8", 3) == -1 && lei_dtype_parse("<f8 ", 4) == -1);
	/* hostile headers: a shape product that overflows (2^32 * 2^32 elements,
	 * announced as 0 bytes), a shape that does not match its byte length, a
	 * byte length past the input, too many dims, an unknown dtype */
	static const uint8_t ovf[] = {7, 3, '<', 'f', '8', 2, 0x80, 0x80, 0x80, 0x80, 0x10,
	                              0x80, 0x80, 0x80, 0x80, 0x10, 0};
	CHECK(lei_codec_validate(ovf, sizeof ovf, NULL, &err) == -1 &&
	      strcmp(err, "array shape does not match its bytes") == 0);
	static const uint8_t mism[] = {7, 3, '<', 'f', '8', 1, 2, 8, 0, 0, 0, 0, 0, 0, 0, 0};
	CHECK(lei_codec_validate(mism, sizeof mism, NULL, &err) == -1 &&
	      strcmp(err, "array shape does not match its bytes") == 0);
	static const uint8_t shortp[] = {7, 3, '<', 'u', '1', 1, 100, 100, 1, 2, 3};
	CHECK(lei_codec_validate(shortp, sizeof shortp, NULL, &err) == -1 &&
	      strcmp(err, "truncated input") == 0);
	static const uint8_t ndim[] = {7, 3, '<', 'u', '1', 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
	CHECK(lei_codec_validate(ndim, sizeof ndim, NULL, &err) == -1 &&
	      strcmp(err, "array has too many dimensions") == 0);
	static const uint8_t dt[] = {7, 3, '<', 'c', '8', 1, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0};
	CHECK(lei_codec_validate(dt, sizeof dt, NULL, &err) == -1 &&
	      strcmp(err, "unknown array dtype") == 0);
	/* inside a table whose other slots need the bytes the array claims */
	static const uint8_t owed[] = {6, 3, 0, 7, 3, '<', 'u', '1', 1, 2, 2, 1, 2};
	CHECK(lei_codec_validate(owed, sizeof owed, NULL, &err) == -1);
	/* max_value_bytes counts the header and the bytes */
	lei_codec_limits lim;
	lei_codec_limits_default(&lim);
	static const uint8_t small[] = {7, 3, '<', 'u', '1', 1, 8, 8, 1, 2, 3, 4, 5, 6, 7, 8};
	lim.max_value_bytes = LEI_DEC_ARRAY + 8;
	CHECK(lei_codec_validate(small, sizeof small, &lim, NULL) == 0);
	lim.max_value_bytes = LEI_DEC_ARRAY + 7;
	CHECK(lei_codec_validate(small, sizeof small, &lim, &err) == -1 &&
	      strcmp(err, "value decodes to more than max_value_bytes") == 0);
	/* the writer refuses what the reader would */
	int64_t huge[2] = {(int64_t)1 << 32, (int64_t)1 << 32};
	CHECK(lei_enc_array_header(&b, LEI_DT_F8, 2, huge) == -1);
	CHECK(lei_enc_array_header(&b, LEI_DT_COUNT, 1, shape) == -1);
	CHECK(lei_enc_array_header(&b, LEI_DT_U1, 9, shape) == -1);
	lei_wbuf_free(&b);
}

int main(void)
{
	test_varint();
	test_zigzag();
	test_writers();
	test_validate();
	test_reader_messages();
	test_value_size();
	test_msg_iov();
	test_mutations();
	test_arrays();
	return TEST_SUMMARY();
}
