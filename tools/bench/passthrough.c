/*
 * A minimal read-only libfuse3 passthrough: the ceiling any FUSE filesystem reaches on a machine.
 *
 *   passthrough SRC MNT [--direct-io] [-f] [other libfuse options]
 *
 * Used by tools/bench.py as a measuring instrument (it is not part of the package).  Every read
 * is one pread(2) of the source into the buffer the reply is sent from, as a real filesystem
 * would do; paths are resolved relative to an O_PATH descriptor of SRC.  libfuse's default
 * multi-threaded loop serves the requests.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int root_fd = -1;
static int direct_io = 0; /* --direct-io: reads bypass the page cache and arrive at the reader's size */

/* "/a/b" -> "a/b", "/" -> "." : relative to root_fd */
static const char *rel(const char *path)
{
    while (*path == '/')
        path++;
    return *path ? path : ".";
}

static void *pt_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    cfg->use_ino = 1;
    cfg->entry_timeout = cfg->attr_timeout = 1.0;
    return NULL;
}

static int pt_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    if (fi != NULL && fi->fh != 0)
        return fstat((int)fi->fh, st) == 0 ? 0 : -errno;
    return fstatat(root_fd, rel(path), st, AT_SYMLINK_NOFOLLOW) == 0 ? 0 : -errno;
}

static int pt_readlink(const char *path, char *buf, size_t size)
{
    ssize_t n = readlinkat(root_fd, rel(path), buf, size - 1);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    return 0;
}

static int pt_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)off; (void)fi; (void)flags;
    int fd = openat(root_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st = {0};
        st.st_ino = de->d_ino;
        st.st_mode = (mode_t)de->d_type << 12;
        if (fill(buf, de->d_name, &st, 0, 0))
            break;
    }
    closedir(d);
    return 0;
}

static int pt_open(const char *path, struct fuse_file_info *fi)
{
    if ((fi->flags & O_ACCMODE) != O_RDONLY)
        return -EROFS;
    int fd = openat(root_fd, rel(path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    fi->fh = (uint64_t)fd;
    fi->direct_io = direct_io;
    return 0;
}

static int pt_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)path;
    size_t done = 0;
    while (done < size) {  /* short only at EOF: libfuse pads nothing, but readers expect full reads */
        ssize_t n = pread((int)fi->fh, buf + done, size - done, off + (off_t)done);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return done ? (int)done : -errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int)done;
}

static int pt_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    close((int)fi->fh);
    return 0;
}

static int pt_statfs(const char *path, struct statvfs *sv)
{
    (void)path;
    return fstatvfs(root_fd, sv) == 0 ? 0 : -errno;
}

static const struct fuse_operations ops = {
    .init = pt_init,
    .getattr = pt_getattr,
    .readlink = pt_readlink,
    .readdir = pt_readdir,
    .open = pt_open,
    .read = pt_read,
    .release = pt_release,
    .statfs = pt_statfs,
};

int main(int argc, char *argv[])
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s SRC MNT [libfuse options]\n", argv[0]);
        return 2;
    }
    root_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root_fd < 0) {
        perror(argv[1]);
        return 1;
    }
    /* libfuse sees "prog MNT options..." without SRC and --direct-io */
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (i == 1)
            continue;
        if (strcmp(argv[i], "--direct-io") == 0) {
            direct_io = 1;
            continue;
        }
        argv[n++] = argv[i];
    }
    argv[n] = NULL;
    return fuse_main(n, argv, &ops, NULL);
}
