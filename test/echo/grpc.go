package echo

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The Echo gRPC service, declared by hand so that no protoc step is needed:
// its messages are the well-known google.protobuf.BytesValue.
//
//	service sockmesh.echo.Echo {
//	  rpc Unary(google.protobuf.BytesValue) returns (google.protobuf.BytesValue);
//	  rpc Stream(stream google.protobuf.BytesValue) returns (stream google.protobuf.BytesValue);
//	}
const (
	// EchoService is the full service name.
	EchoService = "sockmesh.echo.Echo"
	// MethodUnary and MethodStream are the full method names clients invoke.
	MethodUnary  = "/" + EchoService + "/Unary"
	MethodStream = "/" + EchoService + "/Stream"
	// TrailerKey is set in every response's trailers with the answering pod,
	// so tests see trailers survive the proxy.
	TrailerKey = "x-echo-pod"
)

type echoServer interface {
	unary(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error)
	stream(grpc.ServerStream) error
}

type echoService struct{ s *Server }

func (e echoService) unary(ctx context.Context, in *wrapperspb.BytesValue) (*wrapperspb.BytesValue, error) {
	grpc.SetTrailer(ctx, metadata.Pairs(TrailerKey, e.s.cfg.Pod))
	return in, nil
}

// stream echoes each message as it arrives, so a client sees replies while
// it is still sending (full-duplex streaming through the proxy).
func (e echoService) stream(ss grpc.ServerStream) error {
	ss.SetTrailer(metadata.Pairs(TrailerKey, e.s.cfg.Pod))
	for {
		in := new(wrapperspb.BytesValue)
		err := ss.RecvMsg(in)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.SendMsg(in); err != nil {
			return err
		}
	}
}

var echoServiceDesc = grpc.ServiceDesc{
	ServiceName: EchoService,
	HandlerType: (*echoServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Unary",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.BytesValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return srv.(echoServer).unary(ctx, in)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Stream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			return srv.(echoServer).stream(ss)
		},
	}},
}
