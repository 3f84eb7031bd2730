/* item.c: queue items, the unit of every queue of the transport (a peer's
 * outgoing queue, the local delivery queue, the queues of held channels):
 * a frame's header bytes, then a message's bytes.  An item owns one
 * reference to its message.
 *
 * Below peers, connections, local delivery and the sync table, which all
 * make and free items: it calls none of them.  Leans on codec.h (messages
 * shared by reference count) and the context's unpin hook only.
 */
#include "ctx_int.h"

#include <stdlib.h>
#include <string.h>

lei_qitem *lei_item_new(lei_msg *m) {
    lei_qitem *it = calloc(1, sizeof *it);
    if (!it) return NULL;
    if (m) {
        m->refcnt++;
        it->msg = m;
    }
    return it;
}

void lei_item_free(lei_ctx *c, lei_qitem *it) {
    if (it->msg) lei_msg_release(it->msg, c->h.unpin, c->h.ud);
    free(it);
}

/* A frame made of raw bytes (handshake, bind, ack, ctrl): copied into a
 * message of its own so that the queue treats every frame alike. */
lei_qitem *lei_item_bytes(const uint8_t *hdr, size_t hlen, const void *body, size_t blen) {
    lei_msg *m = NULL;
    lei_qitem *it;
    if (blen || hlen > sizeof it->hdr) {
        m = lei_msg_new();
        if (!m) return NULL;
        if ((hlen > sizeof it->hdr && lei_wbuf_put(&m->own, hdr, hlen)) ||
            (blen && lei_wbuf_put(&m->own, body, blen))) {
            lei_msg_release(m, NULL, NULL);
            return NULL;
        }
        m->total = m->own.len;
    }
    it = lei_item_new(m);
    if (m) m->refcnt--; /* lei_item_new took the only reference */
    if (!it) {
        if (m) lei_msg_release(m, NULL, NULL);
        return NULL;
    }
    if (hlen <= sizeof it->hdr) {
        memcpy(it->hdr, hdr, hlen);
        it->hlen = (uint8_t)hlen;
    }
    it->size = it->hlen + (m ? m->total : 0);
    return it;
}
