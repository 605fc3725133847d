/* FUSE passthrough around libfuse 3.14 (see _passthrough.c). */
#ifndef SHUFFLEFS_PASSTHROUGH_H
#define SHUFFLEFS_PASSTHROUGH_H
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stddef.h>

struct fuse_session;

/* Called with every request before libfuse sees it: at INIT, sets up the session's writes so
   that the reply asks for passthrough (if enabled and offered). */
void passthrough_on_init(struct fuse_session *se, const void *request, size_t size, int fd);

/* Whether bytes [p, p + n) of a file mapping are all in the page cache (see _passthrough.c). */
int passthrough_resident(const char *p, size_t n);

extern PyMethodDef passthrough_methods[];
#endif
